//! How a template asks its model to write a function call, read from the template's text as
//! llama.cpp's `common_chat_templates` tells the formats apart (by markers the template prints).
//! The gateway renders tools through such a template and holds the answer to its syntax; a
//! template it does not know gets the tools in a system message and answers a plain JSON call.

/// The call syntax of a template's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// No native syntax known: tools are described in a system message and a call is answered
    /// as one JSON object `{"name": ..., "arguments": {...}}`.
    Generic,
    /// Hermes 2/3, Qwen 2.5 and Qwen 3: each call a block
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call.
    Hermes,
    /// Llama 3.1, 3.2 and 3.3: one JSON object `{"name": ..., "parameters": {...}}`, one call
    /// per turn (their templates refuse a turn with several).
    Llama3Json,
    /// Mistral's v3 and v3-tekken templates (Mistral 7B v0.3, Mistral Large 2407, Nemo 2407):
    /// `[TOOL_CALLS]` (a control token in their vocabularies) and then a JSON array of
    /// `{"name": ..., "arguments": {...}}` objects; each call's id is nine letters and digits,
    /// which the templates check when an earlier call comes back in the history.
    MistralJson,
}

impl ToolSyntax {
    /// The syntax of the template `src`, native only where the template renders tools.
    pub fn detect(src: &str, renders_tools: bool) -> ToolSyntax {
        if !renders_tools {
            return ToolSyntax::Generic;
        }
        if src.contains("<tool_call>") {
            ToolSyntax::Hermes
        } else if src.contains("\"parameters\": dictionary of argument name and its value") {
            ToolSyntax::Llama3Json
        } else if src.contains("[TOOL_CALLS][") || src.contains("[TOOL_CALLS] [") {
            // The array form only: later Mistral templates (Small 3.2, Devstral, Ministral 3)
            // write `[TOOL_CALLS]name[ARGS]{...}`, a syntax not read here.
            ToolSyntax::MistralJson
        } else {
            ToolSyntax::Generic
        }
    }
}
