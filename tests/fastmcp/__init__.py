"""mcp-durable in process for FastMCP 4 servers (mcp_durable/fastmcp/), through real clients."""
