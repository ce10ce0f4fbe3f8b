//! `pagewarden gateway`: the HTTP API and the cluster listener where prefill and decode
//! workers register. Loads the tokenizer and chat template, not the weights.

use std::future::Future;
use std::net::SocketAddr;

use cluster::Net;
use gateway::served::ServedModel;
use grammar::Grammars;
use text::{ChatTemplate, Tokenizer};

use crate::config::Config;
use crate::error::ServeError;
use crate::front::{http_setup, initial_tenants, router_config, tls_certificate};
use crate::model::{model_err, ModelInfo};
use crate::secrets::{cluster_secrets, reload_secrets_on_sighup};

/// `pagewarden gateway`: the HTTP API, and the cluster listener where prefill and decode workers
/// register. Loads the tokenizer and chat template, not the weights.
pub async fn serve_gateway<F, R>(config: Config, shutdown: F, ready: R) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
{
    let tls = tls_certificate(&config)?;
    let config = config.single_model("a gateway")?;
    let secrets = cluster_secrets(&config)?;
    reload_secrets_on_sighup(&config, &secrets);
    let cfg = config.clone();
    let (info, tokenizer, template, grammars) = tokio::task::spawn_blocking(move || -> Result<_, ServeError> {
        let (info, file) = ModelInfo::read(&cfg)?;
        let err = model_err(&info.path);
        let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| err(e.to_string()))?;
        let template = ChatTemplate::from_gguf(&file).map_err(|e| err(e.to_string()))?;
        // Compiled here too: a schema that does not compile is refused before it is routed.
        let grammars = Grammars::new(&tokenizer).map_err(|e| err(e.to_string()))?;
        Ok((info, tokenizer, template, grammars))
    })
    .await
    .map_err(|e| ServeError::Io(format!("model loading task failed: {e}")))??;
    let router = cluster::Router::new(router_config(&config, &info, secrets)?);
    let tenants = initial_tenants(&config)?;
    // Set before the listener opens: every worker registers with the real table.
    router.set_tenants(tenants.0.table(config.limits.tenant_pool_share), &[]);
    let net = Net::default();
    let (listener, bound) = net
        .listen(&config.cluster.listen)
        .await
        .map_err(|e| ServeError::Io(format!("cannot listen on {}: {e}", config.cluster.listen)))?;
    println!("cluster listening on {bound}");
    tokio::spawn(router.clone().serve(listener));
    let r2 = router.clone();
    let served = ServedModel::new(config.model_name.clone(), router, (tokenizer, template, grammars), info.context);
    let setup = http_setup(&config, vec![served], tenants, tls)?;
    Ok(gateway::http::run(setup, shutdown, ready, move || r2.fail_all()).await?)
}
