//! Every rule a request body can break, one variant each, with the field it names: the
//! validator returns these, and [`ApiError::from`] turns each into the OpenAI error envelope
//! (a 400 with `param`; `unsupported_parameter` where the field is understood but the
//! combination is not served). A message never quotes the prompt.

use crate::error::ApiError;

/// Why a request body was refused.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("the request body is not valid JSON: {0}")]
    NotJson(String),
    #[error("the request body must be a JSON object")]
    NotAnObject,
    /// `field` is present with the wrong JSON type; `want` says which.
    #[error("`{field}` must be {want}")]
    WrongType { field: String, want: &'static str },
    #[error("`{0}` is required")]
    Required(&'static str),
    #[error("`n` must be between 1 and {max}, got {got}")]
    Choices { got: i64, max: usize },
    #[error("`best_of` must equal `n` ({n}) here: ranking extra candidates is not supported")]
    BestOf { n: usize },
    #[error("`{field}` must be at least 1, got {got}")]
    MaxTokensBelowOne { field: &'static str, got: i64 },
    #[error("`max_tokens` is {max_tokens}; this server allows at most {ceiling} per request")]
    MaxTokensOverCeiling { max_tokens: usize, ceiling: usize },
    #[error("`top_logprobs` requires `logprobs` to be true")]
    TopLogprobsWithoutLogprobs,
    #[error("`{field}` must be between 0 and {max}, got {got}")]
    TopLogprobs { field: &'static str, got: i64, max: usize },
    /// A sampling parameter out of its range (the sampler's own message).
    #[error("{message}")]
    Sampling { field: &'static str, message: String },
    #[error("`echo` with `logprobs` would need the prompt's log-probabilities, which this server does not compute")]
    EchoWithLogprobs,
    #[error("at most {0} stop strings are allowed")]
    TooManyStops(usize),
    #[error("stop strings must be 1 to {0} bytes long")]
    StopLength(usize),
    #[error("`{key}` is not a token id of this model (0 to {last})")]
    LogitBiasToken { key: String, last: usize },
    /// The schema nests deeper than the workers accept.
    #[error("{0}")]
    SchemaTooDeep(String),
    #[error("`response_format` cannot be combined with `tools`: a call's arguments follow its schema")]
    FormatWithTools,
    #[error("`ignore_eos` cannot be combined with `response_format`")]
    IgnoreEosWithFormat,
    /// The output format does not compile, or does not fit the control message.
    #[error("{message}")]
    Grammar { field: &'static str, message: String },
    #[error("`cache_salt` must be 1 to {max} bytes, got {got}")]
    CacheSalt { got: usize, max: usize },
    #[error("each message must be an object")]
    MessageNotAnObject { index: usize },
    #[error("role must be one of system, developer, user, assistant, tool")]
    Role { index: usize },
    #[error("each tool call needs `function.name` and `function.arguments`")]
    ToolCalls { index: usize },
    #[error("only text content parts are supported")]
    ContentPart { index: usize },
    #[error("content must be a string")]
    Content { index: usize },
    #[error("the chat template refused the messages: {0}")]
    Template(String),
    #[error("cannot tokenize the {what}: {message}")]
    Tokenize { field: &'static str, what: &'static str, message: String },
}

impl ValidationError {
    /// The field the error names (`param` in the envelope).
    pub fn param(&self) -> String {
        use ValidationError as V;
        match self {
            V::NotJson(_) | V::NotAnObject => String::new(),
            V::WrongType { field, .. } => field.clone(),
            V::Required(f) => (*f).to_string(),
            V::Choices { .. } => "n".into(),
            V::BestOf { .. } => "best_of".into(),
            V::MaxTokensBelowOne { field, .. } => (*field).to_string(),
            V::MaxTokensOverCeiling { .. } => "max_tokens".into(),
            V::TopLogprobsWithoutLogprobs => "top_logprobs".into(),
            V::TopLogprobs { field, .. } | V::Sampling { field, .. } | V::Grammar { field, .. } => (*field).to_string(),
            V::EchoWithLogprobs => "echo".into(),
            V::TooManyStops(_) | V::StopLength(_) => "stop".into(),
            V::LogitBiasToken { .. } => "logit_bias".into(),
            V::SchemaTooDeep(_) => "response_format.json_schema.schema".into(),
            V::FormatWithTools => "response_format".into(),
            V::IgnoreEosWithFormat => "ignore_eos".into(),
            V::CacheSalt { .. } => "cache_salt".into(),
            V::MessageNotAnObject { index } => format!("messages[{index}]"),
            V::Role { index } => format!("messages[{index}].role"),
            V::ToolCalls { index } => format!("messages[{index}].tool_calls"),
            V::ContentPart { index } | V::Content { index } => format!("messages[{index}].content"),
            V::Template(_) => "messages".into(),
            V::Tokenize { field, .. } => (*field).to_string(),
        }
    }

    /// Understood, but not served in this combination (`unsupported_parameter`).
    fn unsupported(&self) -> bool {
        matches!(
            self,
            ValidationError::BestOf { .. }
                | ValidationError::EchoWithLogprobs
                | ValidationError::FormatWithTools
                | ValidationError::IgnoreEosWithFormat
        )
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        let message = e.to_string();
        match e {
            ValidationError::NotJson(_) | ValidationError::NotAnObject => ApiError::malformed(message),
            ref u if u.unsupported() => ApiError::unsupported_param(&e.param(), message),
            _ => ApiError::invalid_param(&e.param(), message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_names_its_field_and_the_unsupported_ones_say_so() {
        let e = ApiError::from(ValidationError::Role { index: 2 });
        assert_eq!(e.param.as_deref(), Some("messages[2].role"));
        assert_eq!(e.message, "role must be one of system, developer, user, assistant, tool");
        let e = ApiError::from(ValidationError::BestOf { n: 2 });
        assert_eq!((e.param.as_deref(), e.code), (Some("best_of"), Some("unsupported_parameter")));
        let e = ApiError::from(ValidationError::NotAnObject);
        assert_eq!(e.param, None);
        let e = ApiError::from(ValidationError::WrongType { field: "stop".into(), want: "a string" });
        assert_eq!((e.param.as_deref(), e.message.as_str()), (Some("stop"), "`stop` must be a string"));
    }
}
