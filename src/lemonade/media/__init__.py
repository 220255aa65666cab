"""Pictures and speech through the router: the service code behind `/v1/images/*` and
`/v1/audio/speech`, shared by the HTTP routes (api/), the MCP tools and the omni tool loop (omni/).
Speech to text is serving/transcription.py."""
