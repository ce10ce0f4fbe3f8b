//! The models a gateway serves: each with its own cluster (its workers run only that model),
//! vocabulary, template and context window. A request names one; a tenant may be limited to
//! some, and a model it may not use answers exactly as a model that does not exist, so the
//! answer reveals nothing about what other tenants are served.

use std::sync::Arc;

use sampling::StopTokens;
use text::{ChatTemplate, Tokenizer};

use crate::error::ApiError;
use crate::settings::TenantConfig;

/// One served model and everything the API needs to validate and run requests for it.
pub struct ServedModel {
    /// The name requests give as `model` (and `/v1/models` lists).
    pub name: String,
    /// The cluster of this model: in-process workers (`serve`) or registered remote ones.
    pub backend: cluster::Router,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Compiles `response_format` and tool schemas against this vocabulary.
    pub grammars: grammar::Grammars,
    pub stop_tokens: StopTokens,
    /// The served context window (at most the model's).
    pub context: usize,
}

impl std::fmt::Debug for ServedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedModel").field("name", &self.name).field("context", &self.context).finish_non_exhaustive()
    }
}

impl ServedModel {
    pub fn new(
        name: String,
        backend: cluster::Router,
        (tokenizer, template, grammars): (Tokenizer, ChatTemplate, grammar::Grammars),
        context: usize,
    ) -> ServedModel {
        let stop_tokens = StopTokens::new(tokenizer.stop_tokens());
        ServedModel { name, backend, tokenizer, template, grammars, stop_tokens, context }
    }
}

/// The served models, in configuration order (never empty).
pub struct Models(Vec<Arc<ServedModel>>);

impl Models {
    /// `None` when `models` is empty or two share a name.
    pub fn new(models: Vec<ServedModel>) -> Option<Models> {
        let names: std::collections::HashSet<&str> = models.iter().map(|m| m.name.as_str()).collect();
        (!models.is_empty() && names.len() == models.len()).then(|| Models(models.into_iter().map(Arc::new).collect()))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<ServedModel>> {
        self.0.iter()
    }

    /// The first configured model (the dashboard's title, the development tenant's example).
    pub fn first(&self) -> &Arc<ServedModel> {
        &self.0[0]
    }

    /// The models `tenant` may use, in configuration order.
    pub fn allowed<'a>(&'a self, tenant: &'a TenantConfig) -> impl Iterator<Item = &'a Arc<ServedModel>> {
        self.0.iter().filter(move |m| tenant.may_use(&m.name))
    }

    /// The model `name` for `tenant`: unknown and not allowed are the same 404.
    pub fn resolve(&self, tenant: &TenantConfig, name: &str) -> Result<Arc<ServedModel>, ApiError> {
        self.allowed(tenant).find(|m| m.name == name).cloned().ok_or_else(|| ApiError::model_not_found(name))
    }
}
