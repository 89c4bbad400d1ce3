//! This process's passes at one lease take turns. A pass (a control-plane or node-pool
//! convergence, a remediation) that finds its lease held by another process gives up: the
//! holder's own passes, or the reconciler's next round, move the change on. But one that finds
//! the lease held by a pass of *this* process would give up too, and be lost: a joining
//! member's report arriving while the pass that made the member still holds the lease would
//! wait for the reconciler's next round (a minute by default) before anything promoted it. So
//! a pass first waits for its turn among this process's passes at that lease, and only then
//! claims the lease in the database.
//!
//! At most one pass of each kind waits: a second one asked for meanwhile is folded into it,
//! since a pass reads everything afresh when it starts. Turns are per [`super::Db`], so two API
//! processes' tests sharing one test binary never share one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::OwnedMutexGuard;

use super::leases::Leased;

/// The turns of this process's passes, per lease.
#[derive(Debug, Default)]
pub struct Turns {
    gates: Mutex<HashMap<Leased, Gate>>,
}

#[derive(Debug, Default)]
struct Gate {
    /// Held by the pass whose turn it is.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The kinds of pass waiting for a turn.
    waiting: HashSet<&'static str>,
}

/// A pass's turn at a lease; the next waiting pass goes when it is dropped.
#[derive(Debug)]
pub struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    turns: Arc<Turns>,
    what: Leased,
}

/// A pass of `kind` waiting for its turn; dropped (its turn come, or its task cancelled), it no
/// longer waits.
struct Waiting<'a> {
    turns: &'a Turns,
    what: Leased,
    kind: &'static str,
}

impl Turns {
    fn gates(&self) -> MutexGuard<'_, HashMap<Leased, Gate>> {
        // Nothing panics while the map is locked; were it poisoned, its entries are still
        // whole (each change is one insert or remove).
        self.gates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a pass of `kind` to have its turn at `what`, after the pass of this process
    /// that has it now; `None` when a pass of the same kind waits already (it will read
    /// everything this one would have, after the current one).
    pub async fn turn(self: &Arc<Self>, what: Leased, kind: &'static str) -> Option<Turn> {
        let (turn, waiting) = {
            let mut gates = self.gates();
            let gate = gates.entry(what).or_default();
            if !gate.waiting.insert(kind) {
                return None;
            }
            let waiting = Waiting {
                turns: self,
                what,
                kind,
            };
            (Arc::clone(&gate.turn), waiting)
        };
        let guard = turn.lock_owned().await;
        drop(waiting);
        Some(Turn {
            guard: Some(guard),
            turns: Arc::clone(self),
            what,
        })
    }

    /// Leases with a pass running or waiting in this process.
    pub fn busy(&self) -> usize {
        self.gates().len()
    }

    /// Forgets `what`'s gate once no pass has or waits for a turn.
    fn tidy(&self, what: Leased) {
        let mut gates = self.gates();
        if let Some(gate) = gates.get(&what) {
            // The map's own reference is the only one left: nobody holds or awaits the turn.
            if gate.waiting.is_empty() && Arc::strong_count(&gate.turn) == 1 {
                gates.remove(&what);
            }
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.turns.gates().get_mut(&self.what) {
            gate.waiting.remove(self.kind);
        }
        self.turns.tidy(self.what);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.turns.tidy(self.what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const CONVERGE: &str = "converge";
    const REMEDY: &str = "remedy";

    /// Lets every spawned task run as far as it can.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_pass_waits_for_its_sibling_then_runs() {
        let turns = Arc::new(Turns::default());
        let what = Leased::Membership(1);
        let first = turns.turn(what, CONVERGE).await.unwrap();
        let t = Arc::clone(&turns);
        let second = tokio::spawn(async move { t.turn(what, CONVERGE).await.is_some() });
        settle().await;
        assert!(!second.is_finished(), "the second pass waits its turn");
        drop(first);
        assert!(second.await.unwrap(), "then it has it");
        assert_eq!(turns.busy(), 0, "nothing is left behind");
    }

    #[tokio::test]
    async fn a_third_pass_of_a_kind_folds_into_the_waiting_one_but_not_another_kind() {
        let turns = Arc::new(Turns::default());
        let what = Leased::Pool(4);
        let first = turns.turn(what, CONVERGE).await.unwrap();
        let t = Arc::clone(&turns);
        let second = tokio::spawn(async move { t.turn(what, CONVERGE).await.map(drop).is_some() });
        settle().await;
        assert!(
            turns.turn(what, CONVERGE).await.is_none(),
            "one converge waits already"
        );
        let t = Arc::clone(&turns);
        let remedy = tokio::spawn(async move { t.turn(what, REMEDY).await.map(drop).is_some() });
        settle().await;
        assert!(!remedy.is_finished());
        // Another lease is not held up.
        drop(turns.turn(Leased::Pool(5), CONVERGE).await.unwrap());
        drop(first);
        assert!(second.await.unwrap());
        assert!(remedy.await.unwrap());
        assert_eq!(turns.busy(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_no_trace() {
        let turns = Arc::new(Turns::default());
        let what = Leased::Membership(2);
        let first = turns.turn(what, CONVERGE).await.unwrap();
        let gave_up = tokio::time::timeout(Duration::from_millis(20), turns.turn(what, CONVERGE));
        assert!(gave_up.await.is_err(), "it was still waiting");
        // The cancelled waiter no longer counts: another of its kind may wait.
        let t = Arc::clone(&turns);
        let next = tokio::spawn(async move { t.turn(what, CONVERGE).await.map(drop).is_some() });
        settle().await;
        drop(first);
        assert!(next.await.unwrap());
        assert_eq!(turns.busy(), 0);
    }
}
