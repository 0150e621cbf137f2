//! Admission to run: the in-flight limits a request must get past before it is served, in
//! standalone mode (`pipeline.rs`) and in proxy mode (`proxied.rs`) alike.

use svc_core::user::UserInfo;

use crate::base::verb::Verb;
use crate::http::limits;
use crate::security::authz::GROUP_MASTERS;
use crate::serve::app::ServerState;

/// What lets a request run, held until its handler returns: nothing for `system:masters`
/// (exempt, as Kubernetes' `exempt` priority level), a place under `--max-watches` for a
/// watch, else seats of the read-only or mutating pool (`width` of them: more for a big
/// list), waited for in the user's queue.
#[derive(Default)]
pub struct Admitted<'a> {
    pub watch: Option<limits::Slot>,
    pub _seat: Option<limits::Seat<'a>>,
}

pub async fn admit<'a>(
    app: &'a ServerState,
    user: &UserInfo,
    verb: Verb,
    width: usize,
) -> Result<Admitted<'a>, limits::Rejection> {
    if user.in_group(GROUP_MASTERS) {
        return Ok(Admitted::default());
    }
    if verb == Verb::Watch {
        return app
            .watches
            .try_acquire()
            .map(|w| Admitted {
                watch: Some(w),
                _seat: None,
            })
            .ok_or_else(|| {
                app.flow_metrics
                    .rejected("watch", limits::Rejection::ConcurrencyLimit);
                limits::Rejection::ConcurrencyLimit
            });
    }
    let pool = if verb.is_mutating() {
        &app.mutating_inflight
    } else {
        &app.readonly_inflight
    };
    pool.acquire_width(&user.username, width)
        .await
        .map(|s| Admitted {
            watch: None,
            _seat: Some(s),
        })
}
