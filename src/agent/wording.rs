//! The client's own sentences in its attachments, one table per client version: how long each
//! is in the real client (characters), and the text sent in its place (our words, padded to that
//! length by [`pad_to`]). The agent's own attachments ([`crate::agent::attachments`]) take the
//! 2.1.88 table, its profile; a recorded attachment ([`crate::recording::claude_code::attachment_text`])
//! takes the 2.1.2xx one (the shipped transcripts that record attachments are all 2.1.205–2.1.232).
//!
//! Where each size comes from (docs/fidelity.md, "The client's attachment texts, read from the
//! real clients"): 2.1.88 from reference/layers-1-5.md (the attachments' "render" column) where it
//! gives one; 2.1.2xx measured in the real 2.1.205 and 2.1.232 binaries (npm
//! `@anthropic-ai/claude-code-linux-x64`), which agree on every size below. No client text is in
//! this crate: only lengths.

use crate::agent::profile::{pad_to, FillLayout};

/// The lengths (characters) of the client's own sentences around what an attachment carries.
/// Each is the sentence alone: the separators the client puts around it (`\n` before listing
/// lines, `\n\n` between parts) are the renderer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachmentWording {
    /// The client version the sizes were read from.
    pub version: &'static str,
    /// The skill listing's header (before `\n\n` and the listing).
    pub skills_header: usize,
    /// The deferred tools' header when tools were added (before `\n` and the names).
    pub deferred_added: usize,
    /// The deferred tools' header when tools went away (before `\n` and the names).
    pub deferred_removed: usize,
    /// The agent listing's header, first listing of the thread.
    pub agents_initial: usize,
    /// The agent listing's header for a later delta.
    pub agents_new: usize,
    /// The agent listing's header for removed types.
    pub agents_removed: usize,
    /// The agent listing's note on running agents concurrently (its own part).
    pub agents_concurrency: usize,
    /// The MCP instructions' heading and header (before `\n\n` and the blocks).
    pub mcp_added: usize,
    /// The MCP instructions' header for disconnected servers (before `\n` and the names).
    pub mcp_removed: usize,
    /// The note a removal adds as its own part (not to narrate the change); 0 when the version
    /// has none.
    pub after_removal: usize,
    /// The task tools' reminder, its trailing newline included.
    pub task_reminder: usize,
    /// What separates the reminder from its task lines, both paragraph breaks included.
    pub tasks_header: usize,
    /// Auto mode's instructions (the record's flags all off).
    pub auto_mode: usize,
    /// What auto mode adds when the record's `autoModeConsentFlow` is on (its paragraph break
    /// included).
    pub auto_mode_consent: usize,
    /// Auto mode's paragraph on working through the shell (`bashFirst`, `steerOnly`, `bypass`).
    pub auto_mode_shell: usize,
    /// The line that leads the shell paragraph under `bypass` (before `\n\n`).
    pub auto_mode_bypass_lead: usize,
    /// The line that leads the shell paragraph under `steerOnly` (before `\n\n`).
    pub auto_mode_steer_lead: usize,
}

/// Claude Code 2.1.88, the agent's profile: reference/layers-1-5.md's sizes (skills 65 and MCP
/// 123 there count the `\n\n` after the header, deferred 63 and MCP's removal 87 the `\n`, task
/// reminder 460 without the two tool names it quotes). What the reference does not size
/// (a later agent delta's header, the removed types' header) takes 2.1.2xx's; 2.1.88 adds no note
/// after a removal.
pub const CLIENT_2_1_88: AttachmentWording = AttachmentWording {
    version: "2.1.88",
    skills_header: 63,
    deferred_added: 62,
    deferred_removed: 143,
    agents_initial: 41,
    agents_new: 53,
    agents_removed: 50,
    agents_concurrency: 137,
    mcp_added: 121,
    mcp_removed: 86,
    after_removal: 0,
    task_reminder: 480,
    tasks_header: 32,
    auto_mode: 1171,
    auto_mode_consent: 0,
    auto_mode_shell: 0,
    auto_mode_bypass_lead: 0,
    auto_mode_steer_lead: 0,
};

/// Claude Code 2.1.205 and 2.1.232, measured in their binaries (the same sizes in both): the
/// task reminder 421 (the 2.1.88 text less its closing sentence), the deferred tools' header
/// 248 (it now says how to load them), auto mode 948 with no sparse variant (the record's flags
/// choose its parts), the note after a removal 116.
pub const CLIENT_2_1_2XX: AttachmentWording = AttachmentWording {
    version: "2.1.2xx",
    skills_header: 63,
    deferred_added: 248,
    deferred_removed: 143,
    agents_initial: 41,
    agents_new: 53,
    agents_removed: 50,
    agents_concurrency: 133,
    mcp_added: 121,
    mcp_removed: 86,
    after_removal: 116,
    task_reminder: 421,
    tasks_header: 32,
    auto_mode: 948,
    auto_mode_consent: 1379,
    auto_mode_shell: 329,
    auto_mode_bypass_lead: 40,
    auto_mode_steer_lead: 26,
};

/// The pieces of wording, each with our opening words (the rest is [`pad_to`]'s filler).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    SkillsHeader,
    DeferredAdded,
    DeferredRemoved,
    AgentsInitial,
    AgentsNew,
    AgentsRemoved,
    AgentsConcurrency,
    McpAdded,
    McpRemoved,
    AfterRemoval,
    TaskReminder,
    TasksHeader,
    AutoMode,
    AutoModeConsent,
    AutoModeShell,
    AutoModeBypassLead,
    AutoModeSteerLead,
}

/// Opening words of the skill listing's header (every rendering of it starts with them).
pub const SKILLS_HEADER_OPENING: &str = "Skills you can run with the Skill tool:";

impl Part {
    /// Our opening words (shorter than any size of the part) and its layout.
    fn opening(self) -> (&'static str, FillLayout) {
        use FillLayout::{Line, Paragraphs};
        match self {
            Part::SkillsHeader => (SKILLS_HEADER_OPENING, Line),
            Part::DeferredAdded => ("Tools to load with ToolSearch first:", Line),
            Part::DeferredRemoved => ("These tools are gone; do not load them:", Line),
            Part::AgentsInitial => ("Agent types for the Agent tool:", Line),
            Part::AgentsNew => ("More agent types for the Agent tool:", Line),
            Part::AgentsRemoved => ("These agent types are gone:", Line),
            Part::AgentsConcurrency => ("Start independent agents from one reply.", Line),
            Part::McpAdded => ("# MCP Server Instructions\n\nServer guidance:", Line),
            Part::McpRemoved => ("These servers disconnected:", Line),
            Part::AfterRemoval => ("Background only; mention it if asked.", Line),
            Part::TaskReminder => ("The task list has not been used for a while.", Line),
            Part::TasksHeader => ("\n\nTasks so far:\n\n", Line),
            Part::AutoMode => ("## Auto mode\n\nKeep working without stopping to ask.", Paragraphs),
            Part::AutoModeConsent => ("\n\nWhen an action is blocked, try another way first.", Paragraphs),
            Part::AutoModeShell => ("Work through the shell where it can do the job.", Line),
            Part::AutoModeBypassLead => ("Permission checks are off:", Line),
            Part::AutoModeSteerLead => ("Auto mode is on:", Line),
        }
    }

    fn size(self, w: &AttachmentWording) -> usize {
        match self {
            Part::SkillsHeader => w.skills_header,
            Part::DeferredAdded => w.deferred_added,
            Part::DeferredRemoved => w.deferred_removed,
            Part::AgentsInitial => w.agents_initial,
            Part::AgentsNew => w.agents_new,
            Part::AgentsRemoved => w.agents_removed,
            Part::AgentsConcurrency => w.agents_concurrency,
            Part::McpAdded => w.mcp_added,
            Part::McpRemoved => w.mcp_removed,
            Part::AfterRemoval => w.after_removal,
            Part::TaskReminder => w.task_reminder,
            Part::TasksHeader => w.tasks_header,
            Part::AutoMode => w.auto_mode,
            Part::AutoModeConsent => w.auto_mode_consent,
            Part::AutoModeShell => w.auto_mode_shell,
            Part::AutoModeBypassLead => w.auto_mode_bypass_lead,
            Part::AutoModeSteerLead => w.auto_mode_steer_lead,
        }
    }
}

impl AttachmentWording {
    /// Our text for `part`, exactly as long as the client's sentence in this version (empty when
    /// the version has none). A task reminder keeps its trailing newline. Built once per
    /// (version, part, size) and copied from the memo after: a replay renders the same headers
    /// at every call.
    pub fn text(&self, part: Part) -> String {
        use std::collections::HashMap;
        use std::sync::Mutex;
        static MEMO: std::sync::OnceLock<Mutex<HashMap<(&'static str, Part, usize), String>>> = std::sync::OnceLock::new();
        let key = (self.version, part, part.size(self));
        let memo = MEMO.get_or_init(Default::default);
        if let Some(hit) = memo.lock().expect("wording memo lock").get(&key) {
            return hit.clone();
        }
        let text = self.build(part);
        memo.lock().expect("wording memo lock").insert(key, text.clone());
        text
    }

    fn build(&self, part: Part) -> String {
        let size = part.size(self);
        if size == 0 {
            return String::new();
        }
        let (opening, layout) = part.opening();
        let seed = format!("{part:?}");
        match part {
            // The client's text ends in a newline: ours too.
            Part::TaskReminder => pad_to(opening, size - 1, layout, &seed) + "\n",
            // Paragraph breaks open and close it.
            Part::TasksHeader => {
                let inner = size.saturating_sub(4);
                format!("\n\n{}\n\n", pad_to(opening.trim(), inner, layout, &seed))
            }
            _ => pad_to(opening, size, layout, &seed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::profile::js_len;

    const PARTS: [Part; 17] = [
        Part::SkillsHeader,
        Part::DeferredAdded,
        Part::DeferredRemoved,
        Part::AgentsInitial,
        Part::AgentsNew,
        Part::AgentsRemoved,
        Part::AgentsConcurrency,
        Part::McpAdded,
        Part::McpRemoved,
        Part::AfterRemoval,
        Part::TaskReminder,
        Part::TasksHeader,
        Part::AutoMode,
        Part::AutoModeConsent,
        Part::AutoModeShell,
        Part::AutoModeBypassLead,
        Part::AutoModeSteerLead,
    ];

    /// Every part is exactly as long as the client's sentence in each table, our opening words
    /// first (the skill listing's, which the dialects look for, in particular).
    #[test]
    fn every_part_is_the_clients_length_in_each_version() {
        for table in [CLIENT_2_1_88, CLIENT_2_1_2XX] {
            for part in PARTS {
                let text = table.text(part);
                assert_eq!(js_len(&text), part.size(&table), "{} {part:?}: {text:?}", table.version);
                if part.size(&table) > 0 && part != Part::TasksHeader {
                    assert!(text.starts_with(part.opening().0), "{} {part:?}: {text:?}", table.version);
                }
            }
            assert!(table.text(Part::TaskReminder).ends_with('\n'));
            assert!(table.text(Part::TasksHeader).starts_with("\n\n") && table.text(Part::TasksHeader).ends_with("\n\n"));
        }
    }
}
