//! Where the API accepts a mid-conversation `{"role": "system"}` message, and the tool changes
//! it may carry (reference/current-client-and-api.md §1.2, §1.3). A request that breaks one of
//! these rules is the API's 400 `invalid_request_error`; [`check`] returns its message.
//!
//! - Not the first entry of `messages` (when it has content).
//! - Directly after a `user` turn (one holding only tool_results counts) or an `assistant` turn
//!   ending in a server tool's result; last, or directly before an `assistant` turn. Consecutive
//!   system messages are one system section, so a system message may also follow or precede
//!   another one. Between a `tool_use` and its `tool_result` it can never sit: the turn before it
//!   would be an assistant turn ending in that `tool_use`.
//! - A message with empty content (it only carries `output_config.effort`) renders nothing and
//!   may sit anywhere.
//! - A turn-scoped message (`clear_at`) carries no `cache_control`.
//! - `tool_addition` / `tool_removal` blocks: a `tool_reference` names a tool of `tools` or one
//!   an earlier system message defined by value (else `tool_reference_unresolved`); a
//!   `tool_definition` under the name of a tool of another type is `tool_name_conflict`.

use serde_json::Value;

use super::{ContentBlock, Message, MessageContent, Request, Role};

/// Whether a system message renders nothing: empty content (an effort-only message).
pub fn renders_nothing(message: &Message) -> bool {
    message.role == Role::System
        && match &message.content {
            MessageContent::Text(text) => text.is_empty(),
            MessageContent::Blocks(blocks) => blocks.is_empty(),
        }
}

/// The `tool` object of a `tool_addition` / `tool_removal` block, with the block's type.
pub fn tool_change(block: &ContentBlock) -> Option<(&str, &Value)> {
    let ContentBlock::Other(value) = block else { return None };
    let kind = value.get("type").and_then(Value::as_str)?;
    if kind != "tool_addition" && kind != "tool_removal" {
        return None;
    }
    Some((kind, value.get("tool")?))
}

/// A tool defined by value (`{"type": "tool_definition", "definition": {...}}`) in a tool change.
pub fn inline_definition(block: &ContentBlock) -> Option<&Value> {
    let (_, tool) = tool_change(block)?;
    (tool.get("type").and_then(Value::as_str) == Some("tool_definition")).then(|| tool.get("definition")).flatten()
}

fn blocks(message: &Message) -> &[ContentBlock] {
    match &message.content {
        MessageContent::Text(_) => &[],
        MessageContent::Blocks(blocks) => blocks,
    }
}

/// Whether an assistant turn ends in a server tool's result (`web_search_tool_result`, ...).
fn ends_in_server_tool_result(message: &Message) -> bool {
    message.role == Role::Assistant
        && blocks(message).last().is_some_and(|b| {
            let kind = b.kind();
            kind.ends_with("_tool_result") && kind != "tool_result"
        })
}

/// The positions of the `role: "system"` messages, in order.
pub fn system_positions(messages: &[Message]) -> Vec<usize> {
    messages.iter().enumerate().filter(|(_, m)| m.role == Role::System).map(|(i, _)| i).collect()
}

/// The API's 400 message for a misplaced or malformed system message, or `Ok`.
pub fn check(request: &Request) -> Result<(), String> {
    check_at(request, &system_positions(&request.messages))
}

/// [`check`] of a request whose system messages are at `systems` ([`system_positions`], kept
/// from request to request by [`crate::measure::incremental::Flattener::last_system_messages`]):
/// only they and their neighbours are read, not every message.
pub fn check_at(request: &Request, systems: &[usize]) -> Result<(), String> {
    debug_assert_eq!(systems, system_positions(&request.messages), "the system messages' kept positions are stale");
    if systems.is_empty() {
        return Ok(());
    }
    let messages = &request.messages;
    // Tools by name with their type (`None`: custom), grown by definitions sent by value.
    let mut known: Vec<(String, Option<String>)> = request.tools().iter().map(|t| (t.name.clone(), t.kind.clone().filter(|k| k != "custom"))).collect();
    for &i in systems {
        let message = &messages[i];
        if renders_nothing(message) {
            continue;
        }
        if i == 0 {
            return Err("messages.0: a system message cannot be the first message".to_owned());
        }
        // Effort-only messages render nothing and do not count as neighbours.
        let previous = messages[..i].iter().rev().find(|m| !renders_nothing(m));
        let accepted_after = previous.is_some_and(|p| matches!(p.role, Role::User | Role::System) || ends_in_server_tool_result(p));
        if !accepted_after {
            return Err(format!(
                "messages.{i}: a system message must directly follow a user turn or an assistant turn that ends in a server tool result"
            ));
        }
        if let Some(next) = messages[i + 1..].iter().find(|m| !renders_nothing(m))
            && next.role == Role::User
        {
            return Err(format!("messages.{i}: a system message must be the last message or be followed by an assistant turn"));
        }
        if message.extra.contains_key("clear_at") && blocks(message).iter().any(|b| b.raw_cache_control().is_some()) {
            return Err(format!("messages.{i}: a turn-scoped system message (clear_at) cannot carry cache_control"));
        }
        for (c, block) in blocks(message).iter().enumerate() {
            let Some((kind, tool)) = tool_change(block) else { continue };
            let at = format!("messages.{i}.content.{c}.tool");
            match tool.get("type").and_then(Value::as_str) {
                Some("tool_reference") => {
                    let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
                    if !known.iter().any(|(n, _)| n == name) {
                        return Err(format!("{at}: tool_reference_unresolved: no tool named `{name}` in tools ({kind})"));
                    }
                }
                Some("tool_definition") => {
                    let definition = tool.get("definition").unwrap_or(&Value::Null);
                    let name = definition.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                    let kind = definition.get("type").and_then(Value::as_str).filter(|k| *k != "custom").map(str::to_owned);
                    match known.iter().find(|(n, _)| *n == name) {
                        Some((_, existing)) if *existing != kind => {
                            return Err(format!("{at}: tool_name_conflict: `{name}` is already a tool of another type"));
                        }
                        Some(_) => {}
                        None => known.push((name, kind)),
                    }
                }
                // MCP references name servers the request's MCP configuration holds: not checked.
                _ => {}
            }
        }
    }
    Ok(())
}
