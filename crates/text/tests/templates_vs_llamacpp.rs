//! Chat templates rendered byte for byte as llama.cpp renders them.
//!
//! Each tests/data/templates/<name>.json holds llama-server's `POST /apply-template` answers
//! (`--jinja --chat-template-file <name>.jinja`, clock pinned) for a fixed set of conversations:
//! plain, system prompt, multi-turn, tools, and an assistant tool call answered by a tool result;
//! scripts/template-references.sh writes them. The .jinja files beside them are llama.cpp's test
//! data (models/templates/, MIT licence, (c) the ggml authors), copied so this test needs no
//! llama.cpp. Every case must equal llama.cpp's prompt exactly, or fail the way llama.cpp failed
//! (the template raising); [`KNOWN_DIFFERENCES`] names, with the reason, any case that cannot.

#![allow(clippy::expect_used)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde::Deserialize;
use text::{ChatTemplate, Conversation, TemplateCaps, TextError};

/// Cases that cannot be made equal, as (template, case, why). Each must still differ: a listed
/// case that starts matching fails the test, so the list cannot go stale.
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[];

#[derive(Deserialize)]
struct Reference {
    template: String,
    pinned_epoch: u64,
    bos_token: String,
    eos_token: String,
    caps: LlamaCaps,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct LlamaCaps {
    supports_system_role: bool,
    supports_tools: bool,
    supports_tool_calls: bool,
    supports_object_arguments: bool,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    request: Conversation,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/templates")
}

fn references() -> Vec<(String, Reference)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .expect("tests/data/templates")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_stem().expect("stem").to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).expect("reference");
            (name, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        })
        .collect()
}

/// Where two texts first differ, with some context of each (escaped so whitespace shows).
fn first_difference(want: &str, got: &str) -> String {
    let pos = want.bytes().zip(got.bytes()).position(|(a, b)| a != b).unwrap_or(want.len().min(got.len()));
    let around = |s: &str| {
        let lo = s.floor_char_boundary(pos.saturating_sub(60));
        let hi = s.ceil_char_boundary((pos + 60).min(s.len()));
        format!("{:?}", &s[lo..hi])
    };
    format!(
        "first difference at byte {pos} (llama.cpp {} bytes, ours {} bytes)\n    llama.cpp: ...{}...\n    ours:      ...{}...",
        want.len(),
        got.len(),
        around(want),
        around(got)
    )
}

/// Both refused the conversation. A template's own `raise_exception` must give the same
/// message; any other failure is the engines' own error, worded differently by each (Hermes 3
/// with a `"type": ["string", "null"]` parameter: llama.cpp refuses a list as a dict key, we
/// recurse through the string's characters until minijinja's recursion limit, as Jinja2 would).
fn refused_alike(llama: &str, ours: &TextError) -> Result<(), String> {
    const RAISED: &str = "Jinja Exception: ";
    match (llama.rfind(RAISED).map(|i| llama[i + RAISED.len()..].trim_end()), ours) {
        (Some(want), TextError::TemplateRaised(got)) if want == got => Ok(()),
        (Some(want), _) => Err(format!("llama.cpp: template raised {want:?}; ours: {ours}")),
        (None, TextError::TemplateRaised(got)) => {
            Err(format!("llama.cpp failed ({llama}); our template raised {got:?}"))
        }
        (None, _) => Ok(()),
    }
}

#[test]
fn every_template_renders_every_case_as_llama_cpp_does() {
    let refs = references();
    assert!(refs.len() >= 13, "expected the 13 reference templates, found {}", refs.len());
    let mut failures = Vec::new();
    let (mut equal, mut refused) = (0, 0);
    let mut stale = Vec::new();
    for (name, r) in &refs {
        let src = std::fs::read_to_string(data_dir().join(&r.template)).expect("template file");
        let t = ChatTemplate::from_source(&src, &r.bos_token, &r.eos_token).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want_caps = TemplateCaps {
            supports_system_role: r.caps.supports_system_role,
            supports_tools: r.caps.supports_tools,
            supports_tool_calls: r.caps.supports_tool_calls,
            supports_object_arguments: r.caps.supports_object_arguments,
        };
        if t.caps() != want_caps {
            failures.push(format!("{name}: caps differ\n    llama.cpp: {want_caps:?}\n    ours:      {:?}", t.caps()));
        }
        for case in &r.cases {
            let mut conv = case.request.clone();
            conv.now = UNIX_EPOCH + Duration::from_secs(r.pinned_epoch);
            let got = t.render_with(&conv);
            let outcome = match (&case.prompt, &case.error, &got) {
                (Some(want), _, Ok(got)) if want == got => Ok(()),
                (Some(want), _, Ok(got)) => Err(first_difference(want, got)),
                (Some(_), _, Err(e)) => Err(format!("llama.cpp rendered it, we failed: {e}")),
                (None, Some(want), Err(e)) => refused_alike(want, e),
                (None, Some(want), Ok(got)) => Err(format!("llama.cpp failed ({want}), we rendered {got:?}")),
                (None, None, _) => Err("reference has neither prompt nor error".to_string()),
            };
            let known = KNOWN_DIFFERENCES.iter().find(|(t, c, _)| t == name && *c == case.name);
            match (outcome, known) {
                (Ok(()), None) if case.prompt.is_some() => equal += 1,
                (Ok(()), None) => refused += 1,
                (Ok(()), Some(_)) => stale.push(format!("{name} / {}", case.name)),
                (Err(_), Some(_)) => {}
                (Err(why), None) => failures.push(format!("{name} / {}: {why}", case.name)),
            }
        }
    }
    eprintln!(
        "{} templates: {equal} prompts equal to llama.cpp, {refused} conversations refused by both, {} known differences",
        refs.len(),
        KNOWN_DIFFERENCES.len()
    );
    assert!(stale.is_empty(), "now equal, remove from KNOWN_DIFFERENCES: {stale:?}");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// The call syntax each reference template asks of its model: Hermes blocks for Qwen 2.5,
/// Qwen 3 and Hermes 3, Llama 3's JSON for Llama 3.1-3.3, Mistral's `[TOOL_CALLS]` array for
/// Nemo, and none known for the rest (their tools go through a system message).
#[test]
fn each_templates_call_syntax_is_told_from_its_text() {
    use text::ToolSyntax;
    for (name, r) in &references() {
        let src = std::fs::read_to_string(data_dir().join(&r.template)).expect("template file");
        let t = ChatTemplate::from_source(&src, &r.bos_token, &r.eos_token).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = if name.starts_with("Qwen-") || name.contains("Hermes-3") {
            ToolSyntax::Hermes
        } else if name.starts_with("meta-llama-Llama-3.") {
            ToolSyntax::Llama3Json
        } else if name.starts_with("mistralai-Mistral-Nemo") {
            ToolSyntax::MistralJson
        } else {
            ToolSyntax::Generic
        };
        assert_eq!(t.tool_syntax(), want, "{name}");
    }
}

/// Mistral's v3 template (Mistral 7B v0.3's family: `[INST]` turns, tools in
/// `[AVAILABLE_TOOLS] [...]`, calls as `[TOOL_CALLS] [...]`), which llama.cpp keeps only inside
/// its own test (`tests/test-chat-template.cpp`, "Mistral-Large-Instruct-2407 (mistralai 'v3'
/// template ...)"), not in models/templates: rendered as that test expects llama.cpp's Jinja
/// engine to render its conversation, and told apart as Mistral's call syntax.
#[test]
fn mistral_v3_template_renders_as_llama_cpps_own_test_expects() {
    use text::{Message, ToolSyntax};
    let src = std::fs::read_to_string(data_dir().join("mistralai-v3-Mistral-Large-Instruct-2407.jinja"))
        .expect("template file");
    let t = ChatTemplate::from_source(&src, "", "</s>").expect("compiles");
    let conv = Conversation::new(vec![
        Message::new("system", "You are a helpful assistant"),
        Message::new("user", "Hello"),
        Message::new("assistant", "Hi there"),
        Message::new("user", "Who are you"),
        Message::new("assistant", "   I am an assistant   "),
        Message::new("user", "Another question"),
    ]);
    let want = "[INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>\
                [INST] You are a helpful assistant\n\nAnother question[/INST]";
    assert_eq!(t.render_with(&conv).expect("renders"), want);
    assert_eq!(t.tool_syntax(), ToolSyntax::MistralJson);
}
