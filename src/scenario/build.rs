//! From a validated scenario to a fresh [`World`].

use crate::world::{Clock, Fallback, Rng, ScriptedModel, ScriptedToolOutput, Synthesis, VirtualFs, World};

use super::check::resolve;
use super::schema::{Scenario, Step};

/// A scenario's scripted model and tool outputs as built ([`Scenario::built_script`]).
#[derive(Debug, Clone)]
pub struct BuiltScript {
    pub model: ScriptedModel,
    pub tool_outputs: std::sync::Arc<std::collections::BTreeMap<String, ScriptedToolOutput>>,
}

impl Scenario {
    /// The World's scripted model alone ([`Scenario::into_world`]'s): every assistant step
    /// queued on its lane, the fallback, the rng's `model` fork.
    pub fn scripted_model(&self) -> ScriptedModel {
        let spec = &self.world;
        let fallback = match &spec.fallback {
            None => Fallback::Error,
            Some(f) => Fallback::Synthesize(Synthesis {
                reply_tokens: f.reply_tokens,
                summary_tokens: f.summary_tokens,
                after_script_ends: f.after_script_ends,
            }),
        };
        let mut model = ScriptedModel::new(Rng::new(spec.seed).fork("model")).with_fallback(fallback);
        for step in &self.script {
            if let Step::Assistant(reply) = step {
                model.push(&reply.lane, reply.to_reply());
            }
        }
        model
    }

    /// Builds the World at virtual time 0: clock at `clock_start` in `timezone`, the initial
    /// files (not journaled), the rng from `seed`, every assistant step queued on its lane, the
    /// scripted tool outputs by tool_use id, and the env.
    ///
    /// Infallible because loading already checked everything it could fail on; a failure here
    /// is a bug in those checks and panics with the value.
    pub fn into_world(&self) -> World {
        self.into_world_with(&self.built_script())
    }

    /// What every run of the scenario starts with and none changes in place: the scripted model
    /// ([`Scenario::scripted_model`]) and the scripted tool outputs by tool_use id. Runs of one
    /// scenario start from copies of it ([`Scenario::into_world_with`]), which copy no reply and
    /// no output.
    pub fn built_script(&self) -> BuiltScript {
        let mut tool_outputs = std::collections::BTreeMap::new();
        for step in &self.script {
            if let Step::ToolOutput(outputs) = step {
                let before = tool_outputs.len();
                for output in outputs {
                    tool_outputs.insert(
                        output.tool_use_id.clone(),
                        ScriptedToolOutput {
                            content: output.result_content(),
                            is_error: output.is_error,
                            file: output.file.as_ref().map(|f| (f.path.clone(), f.content.clone())),
                            runs_subagent: output.subagent,
                            completed: before + output.written,
                        },
                    );
                }
            }
        }
        BuiltScript { model: self.scripted_model(), tool_outputs: std::sync::Arc::new(tool_outputs) }
    }

    /// [`Scenario::into_world`] from the scenario's [`Scenario::built_script`], built already.
    /// Debug builds build it again and compare.
    pub fn into_world_with(&self, built: &BuiltScript) -> World {
        #[cfg(debug_assertions)]
        {
            let fresh = self.built_script();
            debug_assert_eq!(format!("{:?}", built.model), format!("{:?}", fresh.model), "the model given is not the scenario's as built");
            debug_assert_eq!(built.tool_outputs, fresh.tool_outputs, "the tool outputs given are not the scenario's");
        }
        let spec = &self.world;
        let clock = Clock::new(spec.clock_start.unix_ms())
            .with_time_zone(&spec.timezone.0)
            .unwrap_or_else(|e| panic!("time zone `{}` passed validation but failed: {e}", spec.timezone.0));
        let rng = Rng::new(spec.seed);
        let mut fs = VirtualFs::new();
        for (path, file) in &spec.files {
            let full = resolve(spec, path).unwrap_or_else(|| panic!("file path `{path}` passed validation but does not resolve"));
            let mtime_ms = file.mtime.map_or(clock.now_ms() as i64, |t| t.unix_ms().saturating_sub(clock.epoch_unix_ms()));
            fs.seed_at(&full, file.contents.clone(), mtime_ms)
                .unwrap_or_else(|e| panic!("file `{full}` passed validation but cannot be created: {e}"));
        }
        let model = built.model.clone();
        World {
            clock,
            fs,
            rng,
            model,
            env: spec.env.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect(),
            cwd: spec.cwd.clone(),
            model_id: spec.model.clone(),
            context_window: spec.context_window,
            max_output_tokens: spec.max_output_tokens,
            tool_outputs: std::sync::Arc::clone(&built.tool_outputs),
            mcp_servers: spec.mcp_servers.clone(),
            hook_answers: spec.hook_answers.clone(),
            claude_md_excludes: spec.settings.claude_md_excludes.clone(),
            include_git_instructions: spec.settings.include_git_instructions.unwrap_or(true),
            git: spec.git.clone(),
            home: spec.home.clone(),
            append_system_prompt: spec.append_system_prompt.as_deref().map(std::sync::Arc::from),
            static_system_prompt: spec.static_system_prompt.as_deref().map(std::sync::Arc::from),
            agent_prompt_extra: spec.agent_prompt_extra.clone(),
            dynamic_system_marker: spec.dynamic_system_marker,
            recorded_attachments: spec.recorded_attachments,
            redact_thinking: spec.redact_thinking,
            restored_unrecorded: spec.restored_unrecorded.as_deref().map(std::sync::Arc::from),
        }
    }
}
