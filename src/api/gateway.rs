//! The served models behind one base URL: one [`AppState`] per
//! `[[models]]` entry, over one store. A request's body `model` picks its
//! model at the edge ([`Picked`]); the call path after that is the model's
//! own. Models that tokenize alike (same tokenizer and template) share one
//! trajectory view, so a trajectory's calls continue each other whatever
//! model made them; models that tokenize differently keep their own.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;

use super::{AppState, StoreState};
use crate::backend::DynBackend;
use crate::config::Config;
use crate::error::ApiError;
use crate::render::Renderer;
use crate::router::adapters::Adapters;
use crate::store::DynStore;
use crate::trajectory::Trajectories;

/// The served models, the first the default.
#[derive(Clone)]
pub struct Gateway(Arc<Shared>);

struct Shared {
    models: Vec<AppState>,
    /// The trainer routes' store: every model's finish hook runs on a
    /// finished trajectory.
    store: StoreState,
}

/// Each served model's name and adapters: what `/v1/models` lists and a
/// 404 names, whichever model answers it.
#[derive(Default)]
pub struct Peers(std::sync::OnceLock<Vec<(Arc<str>, Arc<Adapters>)>>);

impl Peers {
    pub(super) fn ids(&self) -> Option<Vec<String>> {
        let peers = self.0.get()?;
        Some(
            peers
                .iter()
                .flat_map(|(name, adapters)| {
                    std::iter::once(name.to_string()).chain(adapters.names())
                })
                .collect(),
        )
    }
}

impl From<AppState> for Gateway {
    fn from(state: AppState) -> Gateway {
        Gateway::of(vec![state])
    }
}

impl Gateway {
    /// The models of `config` (see [`Config::served`]), each with its
    /// renderer and backends in `[[backends]]` order, over `store`.
    pub fn new(
        config: &Config,
        mut built: Vec<(Arc<Renderer>, Vec<DynBackend>)>,
        store: DynStore,
    ) -> anyhow::Result<Gateway> {
        let views = config.served();
        anyhow::ensure!(
            views.len() == built.len(),
            "one renderer and backend list per model"
        );
        let family = |r: &Renderer| {
            (
                r.tokenizer_sha256().to_string(),
                r.template_sha256().to_string(),
            )
        };
        let mut families: Vec<((String, String), Arc<Trajectories>)> = Vec::new();
        let kinds = {
            let mut k: Vec<_> = built.iter().map(|(r, _)| family(r)).collect();
            k.sort_unstable();
            k.dedup();
            k.len()
        };
        let mut models = Vec::with_capacity(views.len());
        for (i, (view, (renderer, backends))) in views.into_iter().zip(built.drain(..)).enumerate()
        {
            let key = family(&renderer);
            let shared = families
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, t)| t.clone());
            let trajectories = shared.unwrap_or_else(|| {
                // Another family's calls may be in the same trajectories:
                // this view skips them and rereads what they added.
                let t = Arc::new(
                    Trajectories::new(store.clone(), renderer.clone(), view.trajectory.clone())
                        .with_other_families(kinds > 1),
                );
                families.push((key, t.clone()));
                t
            });
            models.push(AppState::build(
                view,
                renderer,
                backends,
                store.clone(),
                trajectories,
                i == 0,
            )?);
        }
        Ok(Gateway::of(models))
    }

    fn of(models: Vec<AppState>) -> Gateway {
        let peers: Vec<_> = models
            .iter()
            .map(|m| (m.model_name.clone(), m.adapters.clone()))
            .collect();
        for m in &models {
            let _ = m.peers.0.set(peers.clone());
        }
        let hooks: Vec<_> = models
            .iter()
            .filter_map(|m| m.store.on_finish.clone())
            .collect();
        let mut store = models[0].store.clone();
        if models.len() > 1 {
            // Text in the tokenizer of the model that made the ids.
            let decoders: Vec<(Arc<str>, _)> = models
                .iter()
                .filter_map(|m| Some((m.model_name.clone(), m.store.decode.clone()?)))
                .collect();
            store.decode = Some(Arc::new(move |model: Option<&str>, ids: &[u32]| {
                let d = match model {
                    Some(m) => decoders.iter().find(|(n, _)| **n == *m),
                    None => decoders.first(),
                };
                d.and_then(|(_, d)| d(None, ids))
            }));
            store.on_finish = Some(Arc::new(move |id: &str| {
                for h in &hooks {
                    h(id);
                }
            }));
        }
        Gateway(Arc::new(Shared { models, store }))
    }

    /// The first model: a request naming none is its.
    pub fn primary(&self) -> &AppState {
        &self.0.models[0]
    }

    pub fn models(&self) -> &[AppState] {
        &self.0.models
    }

    /// The model serving id `model` (the model's name or one of its
    /// adapters), if any.
    pub fn by_id(&self, model: &str) -> Option<&AppState> {
        self.0
            .models
            .iter()
            .find(|m| *m.model_name == *model || m.adapters.is_loaded(model))
    }

    /// The ids `/v1/models` lists: each model, then its loaded adapters.
    pub fn served_ids(&self) -> Vec<String> {
        self.primary().served_ids()
    }
}

impl FromRef<Gateway> for AppState {
    fn from_ref(g: &Gateway) -> AppState {
        g.primary().clone()
    }
}

impl FromRef<Gateway> for StoreState {
    fn from_ref(g: &Gateway) -> StoreState {
        g.0.store.clone()
    }
}

/// A model surface's request: the model its body's `model` names (the
/// first model when it names none, or none served: the model's own checks
/// then answer in the surface's shape) and the body.
pub struct Picked(pub AppState, pub Bytes);

#[derive(serde::Deserialize)]
struct ModelField<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
}

impl FromRequest<Gateway> for Picked {
    type Rejection = axum::response::Response;

    async fn from_request(req: Request, g: &Gateway) -> Result<Picked, Self::Rejection> {
        use axum::response::IntoResponse;
        let body = Bytes::from_request(req, g)
            .await
            .map_err(IntoResponse::into_response)?;
        let state = match g.0.models.len() {
            1 => g.primary(),
            _ => serde_json::from_slice::<ModelField>(&body)
                .ok()
                .and_then(|f| f.model)
                .and_then(|m| g.by_id(&m))
                .unwrap_or_else(|| g.primary()),
        };
        Ok(Picked(state.clone(), body))
    }
}

/// An admin route's model: `?model=` (a model's name or one of its
/// adapters), else the first.
pub struct AdminModel(pub AppState);

impl FromRequestParts<Gateway> for AdminModel {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, g: &Gateway) -> Result<AdminModel, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let named = url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "model")
            .map(|(_, v)| v.into_owned());
        match named {
            None => Ok(AdminModel(g.primary().clone())),
            Some(m) => match g.by_id(&m) {
                Some(s) => Ok(AdminModel(s.clone())),
                None => Err(ApiError::model_not_found_among(&m, &g.served_ids())),
            },
        }
    }
}

impl AppState {
    /// Weight updates (`/admin/weights*`) are the first model's: the store
    /// keeps one fleet weight version and one version sequence, which
    /// staleness counts in.
    pub(super) fn check_weights_model(&self) -> Result<(), ApiError> {
        let first = self
            .peers
            .0
            .get()
            .and_then(|p| p.first().map(|(n, _)| n.clone()));
        match first {
            Some(first) if first != self.model_name => Err(ApiError::invalid(
                "model",
                format!(
                    "weight updates serve the first model ({first}): the store keeps one weight \
                     version sequence; update {} by restarting its backends, or serve it as a \
                     LoRA adapter of {first} and use POST /admin/adapters",
                    self.model_name
                ),
            )),
            _ => Ok(()),
        }
    }
}
