//! `pagewarden gateway`: the HTTP API and the cluster listener where prefill and decode
//! workers register. Loads each served model's tokenizer and chat template, not the weights.

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
/// register. Each served model has its own router; a registering worker joins the router of the
/// model file it loaded (its pairing digest, inside the authenticated handshake).
pub async fn serve_gateway<F, R>(config: Config, shutdown: F, ready: R) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send,
    R: FnOnce(SocketAddr),
{
    let tls = tls_certificate(&config)?;
    let secrets = cluster_secrets(&config)?;
    reload_secrets_on_sighup(&config, &secrets);
    let tenants = initial_tenants(&config)?;
    let mut served = Vec::new();
    let mut routers = Vec::new();
    for m in config.served_models() {
        let cfg = config.for_model(&m);
        let c2 = cfg.clone();
        let (info, tokenizer, template, grammars) = tokio::task::spawn_blocking(move || -> Result<_, ServeError> {
            let (info, file) = ModelInfo::read(&c2)?;
            let err = model_err(&info.path);
            let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| err(e.to_string()))?;
            let template = ChatTemplate::from_gguf(&file).map_err(|e| err(e.to_string()))?;
            // Compiled here too: a schema that does not compile is refused before it is routed.
            let grammars = Grammars::new(&tokenizer).map_err(|e| err(e.to_string()))?;
            Ok((info, tokenizer, template, grammars))
        })
        .await
        .map_err(|e| ServeError::Io(format!("model loading task failed: {e}")))??;
        if routers.iter().any(|(d, _): &([u8; 32], cluster::Router)| *d == info.digest) {
            return Err(ServeError::Io(format!(
                "model {} is the same file as another served model; workers could not tell them apart",
                cfg.model_name
            )));
        }
        let router = cluster::Router::new(router_config(&cfg, &info, secrets.clone())?);
        // Set before the listener opens: every worker registers with the real table.
        router.set_tenants(tenants.0.table(config.limits.tenant_pool_share), &[]);
        routers.push((info.digest, router.clone()));
        served.push(ServedModel::new(cfg.model_name.clone(), router, (tokenizer, template, grammars), info.context));
    }
    let net = Net::default();
    let (listener, bound) = net
        .listen(&config.cluster.listen)
        .await
        .map_err(|e| ServeError::Io(format!("cannot listen on {}: {e}", config.cluster.listen)))?;
    println!("cluster listening on {bound}");
    let routers: Vec<cluster::Router> = routers.into_iter().map(|(_, r)| r).collect();
    tokio::spawn(cluster::serve_models(routers.clone(), listener));
    let setup = http_setup(&config, served, tenants, tls)?;
    Ok(gateway::http::run(setup, shutdown, ready, move || routers.iter().for_each(|r| r.fail_all())).await?)
}
