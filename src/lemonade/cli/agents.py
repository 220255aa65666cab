"""Coding agents `lemonade launch` knows, and how each is pointed at this server (guide-cli.md).

One `Agent` per agent: its program, the environment and arguments that make it talk to Lemonade
with a given model, the config file it reads (OpenCode, Pi), and how to install it. Nothing here
starts anything; `launch_cmd.py` does.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_AGENT_KEY = "lemonade"  # what agents send when the server has no key (it then accepts any)
PROVIDER_NAME = "Lemonade"


@dataclass
class Plan:
    """What to run: program, arguments, environment additions, config files written, and a summary."""

    program: str
    args: list[str]
    env: dict[str, str]
    files: list[Path] = field(default_factory=list)
    shown_env: dict[str, str] = field(default_factory=dict)  # env as printed (keys masked)


@dataclass(frozen=True)
class Agent:
    name: str
    program: str
    install: str
    configure: Callable[[str, str, str, dict[str, Any]], Plan]  # (server url, model, key, options) -> Plan
    fallback_paths: tuple[str, ...] = ()


def _masked(env: dict[str, str], secret: str) -> dict[str, str]:
    return {k: ("<api key>" if v == secret and secret != DEFAULT_AGENT_KEY else v) for k, v in env.items()}


def _claude(url: str, model: str, key: str, options: dict[str, Any]) -> Plan:
    # Claude Code posts to {ANTHROPIC_BASE_URL}/v1/messages: the base URL is the server's origin.
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": key, "LEMONADE_API_KEY": key,
           "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "CLAUDE_CODE_SUBAGENT_MODEL": model,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    return Plan("claude", [], env, shown_env=_masked(env, key))


def _codex(url: str, model: str, key: str, options: dict[str, Any]) -> Plan:
    provider = options.get("provider") or "lemonade"
    args = []
    if not options.get("provider"):  # our provider, defined on the command line (Codex's config.toml untouched)
        args += ["-c", f"model_providers.{provider}={{ name='Lemonade', base_url='{url}/v1', wire_api='responses', "
                       "env_key='OPENAI_API_KEY', requires_openai_auth=false }"]
    args += ["-c", f'model_provider="{provider}"', "-c", "analytics.enabled=false", "-m", model]
    env = {"OPENAI_API_KEY": key, "LEMONADE_API_KEY": key}
    return Plan("codex", args, env, shown_env=_masked(env, key))


def _merge_json(path: Path, update: Callable[[dict[str, Any]], None], start: dict[str, Any]) -> None:
    """Change one agent config file in place, keeping everything else in it; written atomically.
    A file that is not a JSON object is left alone (ValueError naming it)."""
    data: Any = start
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); fix or remove it, then launch again") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a JSON object; fix or remove it, then launch again")
    update(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


OPENCODE_SCHEMA = "https://opencode.ai/config.json"


def _opencode(url: str, model: str, key: str, options: dict[str, Any]) -> Plan:
    base = Path(os.environ["XDG_CONFIG_HOME"]) if os.environ.get("XDG_CONFIG_HOME") else _home() / ".config"
    path = base / "opencode" / "opencode.json"
    context = int(options.get("context") or 0) or 32768

    def update(data: dict[str, Any]) -> None:
        data.setdefault("$schema", OPENCODE_SCHEMA)  # an existing file without one gets it, as Lemonade's does
        data.setdefault("provider", {})[PROVIDER_NAME] = {
            "npm": "@ai-sdk/openai-compatible", "name": "Lemonade Server (local)",
            "options": {"baseURL": f"{url}/v1", "apiKey": key},
            "models": {model: {"name": model, "limit": {"context": context, "output": context // 3}}}}

    _merge_json(path, update, {"$schema": OPENCODE_SCHEMA})
    env = {"LEMONADE_API_KEY": key}
    return Plan("opencode", ["-m", f"{PROVIDER_NAME}/{model}"], env, [path], _masked(env, key))


def _pi(url: str, model: str, key: str, options: dict[str, Any]) -> Plan:
    folder = _home() / ".pi" / "agent"

    def update(data: dict[str, Any]) -> None:
        data.setdefault("providers", {})[PROVIDER_NAME] = {
            "baseUrl": f"{url}/v1", "api": "openai-completions", "apiKey": key, "models": [{"id": model}]}

    _merge_json(folder / "models.json", update, {})
    env = {"LEMONADE_API_KEY": key}
    return Plan("pi", ["--provider", PROVIDER_NAME, "--model", model], env, [folder / "models.json"],
                _masked(env, key))


AGENTS: dict[str, Agent] = {
    "claude": Agent("claude", "claude", "Install Claude Code (npm install -g @anthropic-ai/claude-code) so that "
                    "'claude' is on PATH.", _claude, ("~/.npm-global/bin/claude", "/usr/local/bin/claude")),
    "codex": Agent("codex", "codex", "Install the Codex CLI (npm install -g @openai/codex) so that 'codex' is on "
                   "PATH.", _codex, ("~/.npm-global/bin/codex", "/usr/local/bin/codex")),
    "opencode": Agent("opencode", "opencode", "Install OpenCode: curl -fsSL https://opencode.ai/install | bash, or "
                      "npm i -g opencode-ai.", _opencode,
                      ("~/.npm-global/bin/opencode", "/usr/local/bin/opencode", "~/.local/bin/opencode")),
    "pi": Agent("pi", "pi", "Install the Pi coding agent: npm i -g @earendil-works/pi-coding-agent.", _pi,
                ("~/.npm-global/bin/pi", "/usr/local/bin/pi", "~/.local/bin/pi")),
}


def split_args(text: str | None) -> list[str]:
    """`--agent-args` as argv (shell quoting rules); ValueError for unbalanced quotes."""
    return shlex.split(text) if text else []
