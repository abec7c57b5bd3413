#!/usr/bin/env python3
"""Cases of each candidate break trigger in the real transcripts, and whether each rule holds
leave-one-session-out and leave-one-project-out (docs/fidelity.md "Break rules").

Reads the transcripts directly (main thread only) and uses only the billed usage: a call
*breaks* when its cache_read falls at least 1,000 tokens below what the previous main call
cached (read + creation) and the gap is shorter than the TTL in force (1h when the previous
call wrote 1h tokens, else 5m). Every candidate trigger is a predicate on the record before the
call; a case is a call the predicate selects, and it agrees with a rule when the rule's
prediction (break or no break) is what the record shows.

    python3 scripts/break_cases.py ../shared/realdata/transcripts
"""

import collections
import datetime
import glob
import json
import os
import sys

MIN_DROP = 1000


def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def version_tuple(v):
    parts = [int(p) for p in (v or "0.0.0").split(".")[:3] if p.isdigit()]
    return tuple(parts + [0] * (3 - len(parts)))


def text_of(content):
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def calls_of(path):
    """Main-thread calls with what the record shows before each."""
    calls = []
    seen = set()
    before = collections.defaultdict(list)  # what happened since the previous call
    prompts = []
    queued = []  # [text, queued before a compaction, time] of the client's queue, not yet delivered
    for line in open(path, encoding="utf-8"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("isSidechain"):
            continue
        t = r.get("type")
        if t == "assistant":
            m = r["message"]
            key = r.get("requestId") or m.get("id")
            tools = [b.get("name") for b in m.get("content", []) if isinstance(b, dict) and b.get("type") == "tool_use"]
            if calls and key in seen:
                calls[-1]["tools"] += tools
                calls[-1]["stop"] = m.get("stop_reason") or calls[-1]["stop"]
                continue
            if m.get("model") == "<synthetic>" or key in seen:
                continue
            seen.add(key)
            u = m.get("usage") or {}
            split = u.get("cache_creation") or {}
            calls.append(
                {
                    "time": ts(r["timestamp"]),
                    "version": r.get("version"),
                    "model": m.get("model"),
                    "read": u.get("cache_read_input_tokens") or 0,
                    "creation": u.get("cache_creation_input_tokens") or 0,
                    "one_hour": (split.get("ephemeral_1h_input_tokens") or 0) > 0,
                    "tools": tools,
                    "stop": m.get("stop_reason"),
                    "before": dict(before),
                    "prompts": prompts,
                }
            )
            before = collections.defaultdict(list)
            prompts = []
        elif t == "user":
            c = r["message"]["content"]
            if isinstance(c, list) and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in c):
                continue
            if r.get("isCompactSummary"):
                before["compact_summary"].append(True)
            elif r.get("isMeta"):
                before["meta"].append(text_of(c)[:60])
            else:
                prompts = prompts + [(text_of(c), r.get("permissionMode"))]
                item = next((q for q in queued if q[0] == text_of(c).strip()), None)
                if item is not None:
                    queued.remove(item)
                    before["queued_delivery"].append(item[1])
                    if item[1]:
                        # Once per compaction: the others queued before it now read as after.
                        for q in queued:
                            q[1] = False
        elif t == "queue-operation":
            if r.get("operation") == "enqueue" and isinstance(r.get("content"), str):
                queued.append([r["content"].strip(), False, ts(r["timestamp"])])
        elif t == "system":
            if r.get("subtype") == "compact_boundary":
                # By time: a file's head may hold queue operations written later (0254).
                for q in queued:
                    q[1] = q[1] or q[2] < ts(r["timestamp"])
            before["system:" + str(r.get("subtype"))].append(r.get("compactMetadata", {}).get("trigger") if r.get("subtype") == "compact_boundary" else str(r.get("content", ""))[:80])
        elif t == "progress":
            d = r.get("data") or {}
            if d.get("type") == "hook_progress" and d.get("hookEvent") == "SessionStart":
                before["session_start"].append(d.get("hookName"))
        elif t == "attachment":
            a = r.get("attachment") or {}
            before["attachment:" + str(a.get("type"))].append(a.get("hookName"))
            if a.get("type") == "hook_additional_context" and a.get("hookEvent") in ("PreToolUse", "PostToolUse", "PostToolUseFailure"):
                before["tool_hook_context"].append(a.get("hookName"))
    return calls


def annotate(calls):
    """Adds `break`, `ttl_gap`, `turn` (a new prompt opened the call) and turn numbers."""
    turn = 0
    for i, c in enumerate(calls):
        prev = calls[i - 1] if i else None
        c["turn"] = bool(c["prompts"]) or "compact_summary" in c["before"]
        if c["turn"]:
            turn += 1
        c["turn_no"] = turn
        c["ttl_gap"] = bool(prev) and c["time"] - prev["time"] >= (3600 if prev["one_hour"] else 300)
        c["break"] = bool(prev) and c["read"] + MIN_DROP <= prev["read"] + prev["creation"]
        c["prev"] = prev


def is_command(text):
    return "<command-name>" in text


def is_notification(text):
    return text.lstrip().startswith("<task-notification>")


def typed(call):
    return any(not is_command(t) and not is_notification(t) and not t.startswith("[Request interrupted") for t, _ in call["prompts"])


def mode(call):
    modes = [m for _, m in call["prompts"] if m]
    return modes[-1] if modes else None


def candidates(calls):
    """(rule, call, predicted break) for every case of every candidate."""
    out = []
    turns = [c for c in calls if c["turn"]]
    v = lambda c: version_tuple(c["version"])
    first_tool_search = True
    previous_turn = {}
    hook_in_turn = False  # a tool hook added context since the last prompt after a reply
    for i, c in enumerate(calls):
        hook_before = hook_in_turn
        if c["turn"] and (c["prev"] or {}).get("stop") in (None, "end_turn"):
            hook_in_turn = False
        if c["before"].get("tool_hook_context"):
            hook_in_turn = True
        if c["prev"] is None or c["ttl_gap"]:
            # The TTL explains whatever happens; the rules are about the rest.
            if any(t == "ToolSearch" for t in (c["prev"] or {}).get("tools", [])):
                first_tool_search = False
            continue
        p = c["prev"]
        new = v(c) >= (2, 1, 200)
        if "ToolSearch" in p["tools"]:
            if first_tool_search:
                out.append(("tool_search_first_load" + (" (2.1.200+)" if new else ""), c, not new))
            else:
                out.append(("tool_search_later_load", c, False))
            first_tool_search = False
        if "Skill" in p["tools"]:
            out.append(("skill_call" + (" (2.1.200+)" if new else ""), c, not new))
        if "session_start" in c["before"] and any("resume" in (h or "") for h in c["before"]["session_start"]):
            out.append(("resume", c, True))
        if any("/model" in (x or "") for x in c["before"].get("system:local_command", [])) or any("<command-name>/model" in t for t, _ in c["prompts"]):
            out.append(("model_command_same_model", c, c["model"] != p["model"]))
        if not c["turn"]:
            continue
        t = c["turn_no"]
        prev_turn = previous_turn.get(t - 1)
        if "compact_summary" in c["before"]:
            continue
        if t == 2:
            out.append(("second_user_turn " + ("2.0.76-2.1.39" if v(c) <= (2, 1, 39) else "2.1.42+"), c, v(c) <= (2, 1, 39)))
        if prev_turn is not None:
            if any(is_command(x) for x, _ in prev_turn["prompts"]) and prev_turn["before"].get("meta"):
                out.append(("turn_after_a_slash_command_prompt", c, False))
            if any("Skill" in x["tools"] for x in calls[calls.index(prev_turn) : i]):
                out.append(("turn_after_a_skill_call", c, not new))
            if (2, 1, 37) <= v(c) <= (2, 1, 39) and typed(prev_turn) and prev_turn["turn_no"] > 1:
                bypass = mode(prev_turn) == "bypassPermissions"
                out.append(("typed_prompt_2.1.37-39 " + ("bypassPermissions" if bypass else "other mode"), c, not bypass))
        if any(is_command(x) for x, _ in c["prompts"]) and c["before"].get("meta"):
            out.append(("slash_command_prompt", c, False))
        for crossed in c["before"].get("queued_delivery", []):
            out.append(("queued item delivered, " + ("queued before a compaction" if crossed else "no compaction since"), c, crossed))
        if new and t > 1:
            ended = "system:stop_hook_summary" in c["before"]
            cut = p["stop"] not in (None, "end_turn")
            if cut:
                out.append(("2.1.200+ turn after a cut-off reply", c, False))
            else:
                out.append(("2.1.200+ turn " + ("with" if ended else "without") + " stop summary", c, not ended))
                if ended and hook_before:
                    # The side entry is not read after a turn in which a tool hook added context.
                    lost = v(c) < (2, 1, 232)
                    out.append(("tool hook context in the turn, " + ("2.1.200-2.1.231" if lost else "2.1.232+"), c, lost))
        previous_turn[t] = c
    return out


def main(root):
    files = sorted(glob.glob(os.path.join(root, "*", "*.jsonl")))
    rows = []
    for f in files:
        project = os.path.basename(os.path.dirname(f))
        session = os.path.basename(f).split(".")[0][:12]
        calls = calls_of(f)
        annotate(calls)
        for rule, c, predicted in candidates(calls):
            rows.append((rule, project, session, predicted, c["break"]))
    rules = sorted({r[0] for r in rows})
    print(f"{'candidate':<48} {'cases':>5} {'broke':>5} {'agree':>5} {'sess':>4} {'proj':>4} {'LOSO':>7} {'LOPO':>7}")
    for rule in rules:
        cases = [r for r in rows if r[0] == rule]
        agree = sum(1 for r in cases if r[3] == r[4])
        broke = sum(1 for r in cases if r[4])
        sessions = sorted({r[2] for r in cases})
        projects = sorted({r[1] for r in cases})

        def holds(key, held):
            rest = [r for r in cases if (r[2] if key == "s" else r[1]) != held]
            if not rest:
                return None
            return sum(1 for r in rest if r[3] == r[4]) * 2 > len(rest)

        loso = [holds("s", s) for s in sessions]
        lopo = [holds("p", p) for p in projects]
        fmt = lambda folds: f"{sum(1 for x in folds if x)}/{sum(1 for x in folds if x is not None)}"
        print(f"{rule:<48} {len(cases):>5} {broke:>5} {agree:>5} {len(sessions):>4} {len(projects):>4} {fmt(loso):>7} {fmt(lopo):>7}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/realdata/transcripts")
