//! Layer 2: the tools array — built-in definitions and pool assembly with tool search.

mod defs;
mod pool;

pub use defs::{
    AgentToolListing, BuiltinTool, JSON_SCHEMA_DRAFT, LIST_MCP_RESOURCES, READ_MCP_RESOURCE, TOOL_SEARCH, all_builtin_names,
    agent_tool, base_tool_names, builtin_tool, schema_len,
};
pub use pool::{
    DEFERRED_CLOSE, DEFERRED_OPEN, MCP_DESCRIPTION_MAX, McpToolSpec, PoolInputs, PoolTool, TOOL_SEARCH_AUTO_PERCENT,
    ToolPool, ToolSearchMode, assemble_pool, code_unit_compare, deferred_tools_listing, locale_compare, mcp_tool_name,
    model_supports_tool_reference, normalize_name_for_mcp, tool_search_allowed,
};

pub mod exec;
