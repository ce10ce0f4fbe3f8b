//! Which model each tenant's requests name, and what the audit learned of each such model.
//!
//! A deployment may serve several models and let each tenant use only some of them. Each
//! tenant asks `/v1/models` with its own key and takes, among the models listed for it, the one
//! fewest tenants use so far: tenants spread over every model, and no tenant names a model it
//! may not use (that answers as an unknown model and proves nothing). Each model then gets its
//! own context window, prompt counter and filler calibration, asked as a tenant that uses it:
//! a Gemma prompt and a SmolLM2 prompt of the same words are not the same length.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::client::Client;
use crate::discover;
use crate::error::AuditError;
use crate::finding::{kind, Finding};
use crate::meter::{Meter, MeterSource};
use crate::options::AuditOptions;
use crate::workload::{Calibration, PlanTarget};

/// One model the audit sends requests to.
pub(crate) struct ModelTarget<'a> {
    pub(crate) name: String,
    pub(crate) window: usize,
    /// Whether its outputs are bit-identical alone and batched (as told, else as it declares).
    pub(crate) batch_invariant: bool,
    pub(crate) meter: Meter<'a>,
    pub(crate) calibration: Calibration,
    /// Tenants (indices into the options' list) whose requests name it.
    pub(crate) tenants: Vec<usize>,
}

/// Every model in use and each tenant's.
pub(crate) struct Targets<'a> {
    pub(crate) models: Vec<ModelTarget<'a>>,
    /// Per tenant: an index into `models`.
    of_tenant: Vec<usize>,
}

/// A model's line in report.json.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRow {
    pub model: String,
    pub context_window: usize,
    pub calibration: Calibration,
    pub prompt_lengths: MeterSource,
    /// Names of the tenants whose requests named it.
    pub tenants: Vec<String>,
}

/// The model ids `/v1/models` lists for `key`, and the answer.
fn listed(client: &Client, key: &str, tenant: &str) -> Result<(Vec<String>, Value), AuditError> {
    let (status, body) = client.get("/v1/models", Some(key)).map_err(AuditError::no_answer)?;
    if status != 200 {
        return Err(AuditError::Target(format!(
            "GET /v1/models answered {status} for tenant {tenant} (is its key right?)"
        )));
    }
    let v: Value =
        serde_json::from_str(&body).map_err(|source| AuditError::NotJson { what: "GET /v1/models".into(), source })?;
    let ids: Vec<String> =
        v["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str().map(str::to_string)).collect();
    if ids.is_empty() {
        return Err(AuditError::Target(format!("GET /v1/models lists no model for tenant {tenant}")));
    }
    Ok((ids, v))
}

/// The tokenizer file given for `model`: the one named for it, else one given without a name.
fn tokenizer_for<'o>(opts: &'o AuditOptions, model: &str) -> Option<&'o Path> {
    let named = opts.tokenizers.iter().find(|t| t.model.as_deref() == Some(model));
    named.or_else(|| opts.tokenizers.iter().find(|t| t.model.is_none())).map(|t| t.path.as_path())
}

impl<'a> Targets<'a> {
    /// Asks every tenant's `/v1/models`, assigns each tenant a model, then discovers each
    /// model's window, counter and calibration as its first tenant. Notes go to `notes`; a
    /// tokenizer or window the target lies about, to `findings`.
    pub(crate) fn discover(
        opts: &'a AuditOptions,
        client: &'a Client,
        notes: &mut Vec<String>,
        findings: &mut Vec<Finding>,
    ) -> Result<Self, AuditError> {
        let mut allowed = Vec::new();
        let mut listings = Vec::new();
        for t in &opts.tenants {
            let (ids, v) = listed(client, &t.key, &t.name)?;
            allowed.push(ids);
            listings.push(v);
        }
        let of_model = assign(&allowed);
        let mut names: Vec<&str> = Vec::new();
        let mut of_tenant = Vec::new();
        for (t, m) in of_model.iter().enumerate() {
            let name = allowed[t][*m].as_str();
            let i = names.iter().position(|n| *n == name).unwrap_or_else(|| {
                names.push(name);
                names.len() - 1
            });
            of_tenant.push(i);
        }
        let several = names.len() > 1;
        let mut models = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let tenants: Vec<usize> = (0..of_tenant.len()).filter(|t| of_tenant[*t] == i).collect();
            let first = tenants[0];
            let key = &opts.tenants[first].key;
            let listing = &listings[first];
            let declared = match opts.context_window {
                Some(w) => w,
                None => discover::discover_window(client, key, name, listing)?,
            };
            let batch_invariant = discover::batch_invariant(opts, listing, name);
            let meter = Meter::discover(client, key, name, tokenizer_for(opts, name))?;
            let of = if several { format!(" (model {name})") } else { String::new() };
            // The model file's window bounds whatever the target declares: an over-long prompt
            // answered 200 fails however large a window was claimed.
            let window = match meter.file_context_length() {
                Some(file) if declared > file => {
                    let (who, fails) = match opts.context_window {
                        Some(_) => ("--context-window gives", false),
                        None => ("the target declares", true),
                    };
                    findings.push(Finding {
                        kind: kind::WINDOW_OVERSTATED,
                        fails,
                        detail: format!(
                            "{who} a context window of {declared} tokens{of}, but the model file the audit holds for \
                             it states {file}: the audit judges lengths against {file}"
                        ),
                        ..Default::default()
                    });
                    file
                }
                _ => declared,
            };
            let texts = discover::cross_check_texts();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let differ = meter.cross_check(&texts);
            if let Some((ours, theirs)) = differ.first() {
                findings.push(Finding {
                    kind: kind::TOKENIZER_DISAGREES,
                    fails: true,
                    detail: format!(
                        "the target's tokenizer endpoint counts {} of {} texts otherwise than the model file the audit \
                         holds{of} (e.g. {theirs} tokens where the file gives {ours}): it misstates prompt lengths; the \
                         audit counts with the file",
                        differ.len(),
                        texts.len()
                    ),
                    ..Default::default()
                });
            }
            let (calibration, stated) = discover::calibrate(client, key, name, &meter);
            if let Some(w) = stated.filter(|w| *w != window) {
                // Near-context prompts sized for the wrong window are refused (or are not near it).
                notes.push(format!(
                    "the server states a context window of {w} tokens{of}, not the {window} the audit was given"
                ));
            }
            if !meter.exact() {
                notes.push(format!(
                    "the audit has no tokenizer for this model{of} (pass --tokenizer MODEL.gguf): over-long requests \
                     are judged by their planned size and reported prompt_tokens are not checked"
                ));
            }
            if !calibration.measured {
                notes.push(format!(
                    "the server does not state prompt lengths in its refusals{of}: near-context prompt sizes are \
                     estimates"
                ));
            }
            models.push(ModelTarget { name: name.to_string(), window, batch_invariant, meter, calibration, tenants });
        }
        Ok(Targets { models, of_tenant })
    }

    /// The model `tenant`'s requests name.
    pub(crate) fn of(&self, tenant: usize) -> &ModelTarget<'a> {
        &self.models[self.of_tenant[tenant]]
    }

    /// What the plan needs per tenant.
    pub(crate) fn plan_targets(&self) -> Vec<PlanTarget<'_>> {
        (0..self.of_tenant.len())
            .map(|t| {
                let m = self.of(t);
                PlanTarget { model: &m.name, window: m.window, calibration: m.calibration }
            })
            .collect()
    }

    pub(crate) fn rows(&self, opts: &AuditOptions) -> Vec<ModelRow> {
        self.models
            .iter()
            .map(|m| ModelRow {
                model: m.name.clone(),
                context_window: m.window,
                calibration: m.calibration,
                prompt_lengths: m.meter.source().clone(),
                tenants: m.tenants.iter().map(|t| opts.tenants[*t].name.clone()).collect(),
            })
            .collect()
    }
}

/// Per tenant, an index into its allowed list: in tenant order, the allowed model fewest
/// tenants have taken so far (the first listed on a tie), so that tenants cover every model.
fn assign(allowed: &[Vec<String>]) -> Vec<usize> {
    let mut taken: Vec<(&str, usize)> = Vec::new();
    allowed
        .iter()
        .map(|ids| {
            let count = |id: &str| taken.iter().find(|(n, _)| *n == id).map_or(0, |(_, c)| *c);
            let best = (0..ids.len()).min_by_key(|i| (count(&ids[*i]), *i)).unwrap_or(0);
            match taken.iter_mut().find(|(n, _)| *n == ids[best]) {
                Some((_, c)) => *c += 1,
                None => taken.push((&ids[best], 1)),
            }
            best
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn tenants_spread_over_the_models_they_may_use() {
        let both = ids(&["smol", "gemma"]);
        let picks = assign(&[both.clone(), both.clone(), both.clone(), both]);
        assert_eq!(picks, [0, 1, 0, 1]);
        // A tenant limited to one model gets it; the next one of both takes the other.
        let picks = assign(&[ids(&["gemma"]), ids(&["smol", "gemma"]), ids(&["smol", "gemma"])]);
        assert_eq!(picks, [0, 0, 0]);
        let picks = assign(&[ids(&["smol"]), ids(&["smol", "gemma"]), ids(&["smol", "gemma"])]);
        assert_eq!(picks, [0, 1, 0]);
        assert_eq!(assign(&[ids(&["m"]), ids(&["m"])]), [0, 0]);
    }
}
