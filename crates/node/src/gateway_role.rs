//! `pagewarden gateway`: the HTTP API and the cluster listener where prefill and decode
//! workers register. Loads each served model's tokenizer and chat template, not the weights.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use cluster::Net;
use gateway::served::ServedModel;
use grammar::Grammars;
use text::{ChatTemplate, Tokenizer};

use crate::config::Config;
use crate::error::ServeError;
use crate::front::{http_setup, initial_tenants, router_config, tls_certificate};
use crate::member;
use crate::model::{model_err, OpenedModel};
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
            let (info, (tokenizer, template, grammars)) = OpenedModel::open(&c2)?.digest_beside(|m| {
                let err = model_err(&m.path);
                let tokenizer = Tokenizer::from_gguf(&m.file).map_err(|e| err(e.to_string()))?;
                let template = ChatTemplate::from_gguf(&m.file).map_err(|e| err(e.to_string()))?;
                // Compiled here too: a schema that does not compile is refused before it is routed.
                let grammars = Grammars::new(&tokenizer).map_err(|e| err(e.to_string()))?;
                Ok((tokenizer, template, grammars))
            })?;
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
    println!("{}{bound}", types::listening::CLUSTER);
    let routers: Vec<cluster::Router> = routers.into_iter().map(|(_, r)| r).collect();
    tokio::spawn(cluster::serve_models(routers.clone(), listener));
    let publication = match &config.membership {
        None => None,
        Some(m) => {
            let cluster_addr = advertised(m.advertise.as_deref(), &bound)?;
            let id = match &config.cluster.name {
                Some(n) => n.clone(),
                None => member::default_name("gateway")?,
            };
            let record = membership::GatewayRecord { id: id.clone(), cluster_addr };
            println!("membership: gateway {id} published at {}", m.prefix);
            let rejected = Arc::new(gateway::metrics::RejectedEntries::default());
            let (publication, count) =
                member::join_as_gateway(m, &record, routers.clone(), &secrets, rejected.clone())?;
            Some((publication, id, count, member::tenant_announcements(m)?, rejected))
        }
    };
    let announced = publication.as_ref().map(|(_, _, _, a, _)| a.clone());
    let mut setup = http_setup(&config, served, tenants, tls, announced)?;
    setup.gateways = publication.as_ref().map(|(_, _, count, _, _)| count.clone());
    setup.membership_rejected = publication.as_ref().map(|(.., rejected)| rejected.clone());
    let result = gateway::http::run(setup, shutdown, ready, move || routers.iter().for_each(|r| r.fail_all())).await;
    if let Some((p, id, ..)) = publication {
        member::withdraw(p, &id).await;
    }
    Ok(result?)
}

/// The cluster address workers are told to dial: `[membership] advertise`, else the bound
/// listener unless it is a wildcard (which no worker could dial).
fn advertised(advertise: Option<&str>, bound: &str) -> Result<String, ServeError> {
    if let Some(a) = advertise {
        return Ok(a.to_string());
    }
    match bound.parse::<SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => Err(ServeError::Io(format!(
            "cluster listening on the wildcard address {bound}: set [membership] advertise to the address workers dial"
        ))),
        _ => Ok(bound.to_string()),
    }
}
