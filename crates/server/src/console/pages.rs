//! The console's pages: each gathers a view from the operation layer and
//! renders it.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use http::StatusCode;

use super::{Console, Session};

pub async fn dashboard(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Response {
    let generation = console.generations.current();
    let authority = &generation.authority;
    let now = authority.clock.unix();
    let view = match crate::admin::dashboard::dashboard(&generation.config, authority.store(), now)
        .await
    {
        Ok(view) => view,
        Err(e) => return console.unavailable(&e),
    };
    let charts: Vec<_> = view
        .profiles
        .iter()
        .map(|p| {
            minijinja::context! {
                profile => p.name.clone(),
                issued => p.issued_total,
                failed => p.failed_total,
                chart => super::chart::build(&view.days, &p.issued, &p.failed),
            }
        })
        .collect();
    console.page(
        StatusCode::OK,
        "dashboard.html",
        Some(&session),
        minijinja::context! { view, charts },
    )
}
