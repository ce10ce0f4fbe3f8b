//! `[[models]]`: the models one deployment serves, each under the name requests give, from a
//! file or a packaged model fetched by name, with its own context window and pool size. Without
//! the section the top-level `model`, `model_name`, `context_window` and `[pool]` describe the
//! one served model, as before.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::PoolSize;
use crate::config_error::{invalid, ConfigError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    name: String,
    file: Option<PathBuf>,
    package: Option<String>,
    context_window: Option<usize>,
    pool: Option<RawModelPool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelPool {
    tokens: Option<usize>,
    bytes: Option<usize>,
}

/// One served model.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// What requests name as `model`, what `/v1/models` lists and tenants' `models` allow.
    pub name: String,
    pub source: ModelSource,
    /// `None`: the model's.
    pub context_window: Option<usize>,
    /// `None`: `[pool]`'s size, else twice the context window.
    pub pool_size: Option<PoolSize>,
}

/// Where a model's file comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    File(PathBuf),
    /// Fetched with pip from its PyPI packages and checked against its digest.
    Package(&'static fetch::KnownModel),
}

pub(crate) fn parse(raw: Vec<RawModel>, default_pool: Option<PoolSize>) -> Result<Vec<ModelSettings>, ConfigError> {
    let mut out: Vec<ModelSettings> = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let field = |f: &str| format!("models[{i}].{f}");
        if m.name.trim().is_empty() || m.name.len() > 128 || m.name.chars().any(char::is_control) {
            return Err(invalid(field("name"), "must be 1-128 printable characters"));
        }
        if out.iter().any(|o| o.name == m.name) {
            return Err(invalid(field("name"), format!("`{}` appears twice", m.name)));
        }
        let source = match (m.file, m.package) {
            (Some(f), None) => ModelSource::File(f),
            (None, Some(p)) => ModelSource::Package(fetch::known(&p).ok_or_else(|| {
                let known: Vec<&str> = fetch::KNOWN.iter().map(|k| k.name).collect();
                invalid(field("package"), format!("`{p}` is not a packaged model; known: {}", known.join(", ")))
            })?),
            _ => return Err(invalid(field("file"), "set either `file` (a GGUF path) or `package` (a packaged model)")),
        };
        if m.context_window == Some(0) {
            return Err(invalid(field("context_window"), "must be at least 1, got 0"));
        }
        let pool_size = match m.pool {
            None => default_pool,
            Some(RawModelPool { tokens: Some(t), bytes: None }) if t > 0 => Some(PoolSize::Tokens(t)),
            Some(RawModelPool { tokens: None, bytes: Some(b) }) if b > 0 => Some(PoolSize::Bytes(b)),
            Some(_) => return Err(invalid(field("pool"), "set one of `tokens` or `bytes`, at least 1")),
        };
        out.push(ModelSettings { name: m.name, source, context_window: m.context_window, pool_size });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ModelSource, PoolSize};

    fn err(toml: &str) -> String {
        Config::from_toml_str(toml).unwrap_err().to_string()
    }

    #[test]
    fn models_are_read_with_their_sources_windows_and_pools() {
        let c = Config::from_toml_str(
            "[pool]\ntokens = 9000\n[[models]]\nname = \"a\"\nfile = \"/m/a.gguf\"\ncontext_window = 1024\n\
             [[models]]\nname = \"b\"\npackage = \"gemma-3-270m\"\npool = { bytes = 1000000 }\n",
        )
        .unwrap();
        assert_eq!(c.models.len(), 2);
        assert!(matches!(&c.models[0].source, ModelSource::File(p) if p.to_str() == Some("/m/a.gguf")));
        assert_eq!((c.models[0].context_window, c.models[0].pool_size), (Some(1024), Some(PoolSize::Tokens(9000))));
        assert!(matches!(c.models[1].source, ModelSource::Package(p) if p.name == "gemma-3-270m"));
        assert_eq!(c.models[1].pool_size, Some(PoolSize::Bytes(1_000_000)));
        let b = c.for_model(&c.models[1]);
        assert_eq!(
            (b.model_name.as_str(), b.model.is_none(), b.model_package.map(|p| p.name)),
            ("b", true, Some("gemma-3-270m"))
        );
    }

    #[test]
    fn without_models_the_top_level_fields_describe_the_one_model() {
        let c = Config::from_toml_str("model = \"/x.gguf\"\nmodel_name = \"x\"\ncontext_window = 512\n").unwrap();
        let m = c.served_models();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].name.as_str(), m[0].context_window), ("x", Some(512)));
        assert!(c.single_model("a worker").is_ok());
    }

    #[test]
    fn bad_model_entries_are_refused_naming_the_field() {
        let e = err("[[models]]\nname = \"a\"\npackage = \"llama-70b\"\n");
        assert!(e.contains("models[0].package") && e.contains("smollm2-135m-instruct, gemma-3-270m"), "{e}");
        let e = err("[[models]]\nname = \"a\"\nfile = \"/a\"\npackage = \"gemma-3-270m\"\n");
        assert!(e.contains("models[0].file"), "{e}");
        let e = err("[[models]]\nname = \"a\"\nfile = \"/a\"\n[[models]]\nname = \"a\"\nfile = \"/b\"\n");
        assert!(e.contains("models[1].name") && e.contains("twice"), "{e}");
        let e = err("model_name = \"x\"\n[[models]]\nname = \"a\"\nfile = \"/a\"\n");
        assert!(e.contains("model_name"), "{e}");
        let e = err("[[models]]\nname = \"a\"\nfile = \"/a\"\npool = { tokens = 0 }\n");
        assert!(e.contains("models[0].pool"), "{e}");
    }

    #[test]
    fn a_tenant_may_only_be_limited_to_served_models() {
        let e = err("last_tenant_id = 1\n[[models]]\nname = \"a\"\nfile = \"/a\"\n[[tenants]]\nid = 1\nname = \"t\"\n\
             key_sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\nmodels = [\"b\"]\n");
        assert!(e.contains("tenants[0].models") && e.contains("`b` is not a served model"), "{e}");
    }

    #[test]
    fn a_worker_names_its_model_when_there_are_several() {
        let c =
            Config::from_toml_str("[[models]]\nname = \"a\"\nfile = \"/a\"\n[[models]]\nname = \"b\"\nfile = \"/b\"\n")
                .unwrap();
        let e = c.single_model("a worker").unwrap_err().to_string();
        assert!(e.contains("a worker loads one model") && e.contains("--model NAME"), "{e}");
        assert_eq!(c.model_named("b").unwrap().model_name, "b");
        let e = c.model_named("z").unwrap_err().to_string();
        assert!(e.contains("`z`") && e.contains("a, b"), "{e}");
    }
}
