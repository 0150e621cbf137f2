//! The scenario dispatcher: one name per scenario, and the run that hands a scenario to the
//! module that implements it.

use anyhow::Result;

use crate::Params;
use crate::report::Results;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scenario {
    Fanout,
    SlowWatcher,
    Churn,
    Events,
    List,
    Get,
    RelistStorm,
    Fairness,
    Hold,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Fanout => "fanout",
            Scenario::SlowWatcher => "slow-watcher",
            Scenario::Churn => "churn",
            Scenario::Events => "events",
            Scenario::List => "list",
            Scenario::Get => "get",
            Scenario::RelistStorm => "relist-storm",
            Scenario::Fairness => "fairness",
            Scenario::Hold => "hold",
        }
    }
}

/// Runs one scenario to its end and returns its results.
pub async fn run(scenario: Scenario, p: &Params) -> Result<Results> {
    match scenario {
        Scenario::List => crate::list::run(p).await,
        Scenario::Get => crate::get::run(p).await,
        Scenario::RelistStorm => crate::relist::run(p).await,
        Scenario::Fairness => crate::fairness::run(p).await,
        Scenario::Hold => crate::hold::run(&crate::hold::HoldArgs::of(p.clone())).await,
        Scenario::Fanout | Scenario::SlowWatcher | Scenario::Churn | Scenario::Events => {
            crate::fanout::run(scenario, p).await
        }
    }
}
