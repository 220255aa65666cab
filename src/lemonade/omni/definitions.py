"""The built-in omni system prompt and tool definitions (openai.md "Server-side tools").

One place for them, so the chat endpoint and MCP `lemonade_omni` offer the collection's LLM the same
tools: upstream Lemonade's five (its toolDefinitions.json). Upstream's server runs the three that make
media and leaves `transcribe_audio` and `analyze_image` to its desktop app; this server runs all five,
those two with upstream's descriptions and parameters, so a planner tuned for them calls them alike
(but `analyze_image`'s `image_url` is `#N`, the user's Nth picture: the LLM never sees the data). A
tool is offered only when the collection has a component that can run it (`toolset.py`,
`media.RUNNERS`). The prompt is a template: `{tool_list}` becomes one line per offered tool,
`{tool_guidance}` the guidance of the offered tools only, so the LLM is never told about a tool it
does not have. A collection may carry its own `system_prompt` template with both placeholders
(custom-models.md).
"""

from __future__ import annotations

from typing import Any

from lemonade.labels import OMNI_PLACEHOLDERS

OMNI_RECIPE = "collection.omni"
MAX_ROUNDS = 5  # LLM calls per request; a planner that keeps calling tools is stopped here
PLACEHOLDERS = OMNI_PLACEHOLDERS

SYSTEM_PROMPT = (
    "You are a helpful assistant that can create media with these tools:\n\n{tool_list}\n\n"
    "Call a tool when the user asks for something it makes; several calls are fine when the request "
    "needs them. Once a tool has run, tell the user in a short, friendly sentence what you made. "
    "When no tool fits, simply answer in text.{tool_guidance}"
)

_IMAGE_OPTIONS: dict[str, Any] = {
    "size": {"type": "string",
             "description": "Output size as WIDTHxHEIGHT in pixels. Leave it out (the image model's own size) "
                            "unless the user asks for a size or aspect ratio."},
    "steps": {"type": "integer", "minimum": 1, "maximum": 100,
              "description": "Denoising steps; only when the user asks about speed, quality or a step count."},
    "cfg_scale": {"type": "number", "minimum": 0,
                  "description": "How strictly to follow the prompt; only when the user asks for it."},
    "seed": {"type": "integer", "description": "Random seed, for a reproducible image when the user gives one."},
}

# `guidance`: a line for the system prompt, included only when the tool is offered.
OMNI_TOOLS: list[dict[str, Any]] = [
    {
        "function": {
            "name": "generate_image",
            "description": "Create a new image from a text description (not for changing an existing image).",
            "parameters": {
                "type": "object", "required": ["prompt"], "additionalProperties": False,
                "properties": {"prompt": {"type": "string", "description": "What the image shows, in detail."},
                               **_IMAGE_OPTIONS},
            },
        },
    },
    {
        "guidance": "To change an image that is already in the conversation, call edit_image (it edits the most "
                    "recent image); generate_image is for new images only.",
        "function": {
            "name": "edit_image",
            "description": "Change the most recent image of this conversation as described.",
            "parameters": {
                "type": "object", "required": ["prompt"], "additionalProperties": False,
                "properties": {"prompt": {"type": "string", "description": "The change to make."},
                               **_IMAGE_OPTIONS},
            },
        },
    },
    {
        "function": {
            "name": "transcribe_audio",
            "description": "Transcribe audio to text (speech-to-text). Use this when the user provides an audio "
                           "file or when you see '[User provided audio file #N]' placeholders in the conversation. "
                           "The audio data is automatically provided by the system, just call this tool with the "
                           "language parameter.",
            "parameters": {
                "type": "object", "required": [], "additionalProperties": False,
                "properties": {"language": {"type": "string", "description": "Language of the audio (ISO 639-1 "
                                                                             "code, e.g. 'en', 'es', 'fr')"}},
            },
        },
    },
    {
        "guidance": "When the user sends an image (shown as '[User provided image #N]'), use the analyze_image "
                    "tool to look at the image before responding about it.",
        "function": {
            "name": "analyze_image",
            "description": "Analyze, describe, or answer questions about an image. Use this when the user shares an "
                           "image and asks you to look at it, describe it, read text from it, identify objects, or "
                           "answer any question about what's in the image.",
            "parameters": {
                "type": "object", "required": ["image_url", "question"], "additionalProperties": False,
                "properties": {
                    # upstream: "The URL or base64 data URI of the image"; an LLM here sees placeholders,
                    # never the data (loop.py), so it names the picture, and a grammar keeps it short
                    "image_url": {"type": "string", "pattern": "^#[1-9][0-9]{0,2}$",
                                  "description": "The image to analyze: '#N' for '[User provided image #N]'"},
                    "question": {"type": "string", "description": "The question to answer about the image, or "
                                                                 "'describe' for a general description"},
                },
            },
        },
    },
    {
        "function": {
            "name": "text_to_speech",
            "description": "Speak text aloud as audio. Use it when the user asks you to say, speak or read "
                           "something out loud.",
            "parameters": {
                "type": "object", "required": ["input"], "additionalProperties": False,
                "properties": {
                    "input": {"type": "string", "description": "The exact text to speak."},
                    "voice": {"type": "string", "description": "A voice name; leave it out for the default voice."},
                },
            },
        },
    },
]
OMNI_TOOL_NAMES = tuple(t["function"]["name"] for t in OMNI_TOOLS)
