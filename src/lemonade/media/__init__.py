"""Pictures and speech through the router: the service code behind `/v1/images/*`,
`/v1/audio/speech` and `/v1/audio/transcriptions`, shared by the HTTP routes (api/), the MCP tools
and the omni tool loop (omni/)."""
