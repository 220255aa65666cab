"""The server as an MCP client (upstream Lemonade's server-side MCP client host, d1e42bab7): external MCP
servers the admin registers (stdio only), kept in `<config dir>/mcp_servers.json`, connected on
request, their tools listed and called through `/internal/mcp/*` (api/internal_mcp.py) and offered
to omni collections' LLMs (omni/toolset.py). `config.py` is what a server entry may say and how it
is stored; `host.py` runs the connections with the official `mcp` package's client."""
