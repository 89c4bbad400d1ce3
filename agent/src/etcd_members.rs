//! etcd membership as a control-plane node's agent changes it, through etcd's v3 JSON gateway
//! over mutual TLS (no gRPC client: the static agent stays small): list the members, add this
//! node as a learner, promote it once it has caught up (etcd refuses until then), remove a
//! member, and move leadership away from a member about to leave. The API never dials into a
//! cluster: these run on a node, told by its bundle.
//!
//! The gateway writes 64-bit member ids as decimal strings; [`MemberId`] keeps them exact.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::http;

/// How long one gateway call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// An etcd member id (uint64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(pub u64);

impl std::fmt::Display for MemberId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

fn id_of(value: &Value) -> Option<MemberId> {
    match value {
        Value::String(s) => s.parse().ok().map(MemberId),
        Value::Number(n) => n.as_u64().map(MemberId),
        _ => None,
    }
}

/// One member as `member list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: MemberId,
    /// Empty until a learner has started.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

#[derive(Deserialize)]
struct RawMember {
    #[serde(rename = "ID")]
    id: Value,
    #[serde(default)]
    name: String,
    #[serde(rename = "peerURLs", default)]
    peer_urls: Vec<String>,
    #[serde(rename = "clientURLs", default)]
    client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    is_learner: bool,
}

impl RawMember {
    fn member(self) -> Result<Member, String> {
        Ok(Member {
            id: id_of(&self.id)
                .ok_or_else(|| format!("a member id that is not a u64: {}", self.id))?,
            name: self.name,
            peer_urls: self.peer_urls,
            client_urls: self.client_urls,
            is_learner: self.is_learner,
        })
    }
}

/// A client of one member's gateway (`https://host:2379`), with a client certificate etcd
/// trusts.
pub struct Etcd {
    agent: ureq::Agent,
    endpoint: String,
}

/// Why a membership call failed; `Refused` carries etcd's own words (e.g. a learner that has
/// not caught up yet, or a second learner).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd at {endpoint} is unreachable: {reason}")]
    Unreachable { endpoint: String, reason: String },
    #[error("etcd refused {call}: {message}")]
    Refused { call: &'static str, message: String },
    #[error("etcd answered {call} with something unreadable: {reason}")]
    Unreadable { call: &'static str, reason: String },
}

impl Etcd {
    pub fn new(
        endpoint: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, String> {
        Self::with_timeout(endpoint, ca_pem, cert_pem, key_pem, CALL_TIMEOUT)
    }

    /// A client whose calls give up after `timeout` (a membership step then tries the next
    /// endpoint, and again within its own deadline).
    pub fn with_timeout(
        endpoint: &str,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        timeout: Duration,
    ) -> Result<Self, String> {
        let tls = http::mutual_tls(ca_pem, cert_pem, key_pem).map_err(|e| e.to_string())?;
        Ok(Self {
            agent: http::agent(tls, timeout),
            endpoint: endpoint.trim_end_matches('/').to_owned(),
        })
    }

    fn call(&self, call: &'static str, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let url = format!("{}{path}", self.endpoint);
        let bytes = serde_json::to_vec(body).map_err(|e| EtcdError::Unreadable {
            call,
            reason: e.to_string(),
        })?;
        let request = self
            .agent
            .post(&url)
            .set("Content-Type", "application/json");
        let response = match request.send_bytes(&bytes) {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => {
                let text = http::read_capped(response, 64 * 1024).unwrap_or_default();
                let said: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
                let message = said["message"]
                    .as_str()
                    .or_else(|| said["error"].as_str())
                    .map(str::to_owned)
                    .unwrap_or_else(|| String::from_utf8_lossy(&text).chars().take(300).collect());
                return Err(EtcdError::Refused { call, message });
            }
            Err(e) => {
                return Err(EtcdError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    reason: e.to_string(),
                });
            }
        };
        let text = http::read_capped(response, 1024 * 1024)
            .map_err(|reason| EtcdError::Unreadable { call, reason })?;
        serde_json::from_slice(&text).map_err(|e| EtcdError::Unreadable {
            call,
            reason: e.to_string(),
        })
    }

    fn members_of(call: &'static str, answer: &Value) -> Result<Vec<Member>, EtcdError> {
        let raw: Vec<RawMember> =
            serde_json::from_value(answer["members"].clone()).map_err(|e| {
                EtcdError::Unreadable {
                    call,
                    reason: e.to_string(),
                }
            })?;
        raw.into_iter()
            .map(|m| {
                m.member()
                    .map_err(|reason| EtcdError::Unreadable { call, reason })
            })
            .collect()
    }

    /// Every member, learners included.
    pub fn members(&self) -> Result<Vec<Member>, EtcdError> {
        let answer = self.call("member list", "/v3/cluster/member/list", &json!({}))?;
        Self::members_of("member list", &answer)
    }

    /// Adds a learner with `peer_url`; its id. etcd allows one learner at a time.
    pub fn add_learner(&self, peer_url: &str) -> Result<MemberId, EtcdError> {
        let call = "member add";
        let answer = self.call(
            call,
            "/v3/cluster/member/add",
            &json!({"peerURLs": [peer_url], "isLearner": true}),
        )?;
        id_of(&answer["member"]["ID"]).ok_or_else(|| EtcdError::Unreadable {
            call,
            reason: "no member id in the answer".into(),
        })
    }

    /// Makes a caught-up learner a voter (refused while it is behind).
    pub fn promote(&self, id: MemberId) -> Result<(), EtcdError> {
        self.call(
            "member promote",
            "/v3/cluster/member/promote",
            &json!({"ID": id.0.to_string()}),
        )
        .map(drop)
    }

    pub fn remove(&self, id: MemberId) -> Result<(), EtcdError> {
        self.call(
            "member remove",
            "/v3/cluster/member/remove",
            &json!({"ID": id.0.to_string()}),
        )
        .map(drop)
    }

    /// The member this client talks to, and the leader it knows.
    pub fn status(&self) -> Result<(MemberId, MemberId), EtcdError> {
        let call = "status";
        let answer = self.call(call, "/v3/maintenance/status", &json!({}))?;
        let unreadable = |what: &str| EtcdError::Unreadable {
            call,
            reason: format!("no {what}"),
        };
        Ok((
            id_of(&answer["header"]["member_id"]).ok_or_else(|| unreadable("member id"))?,
            id_of(&answer["leader"]).ok_or_else(|| unreadable("leader"))?,
        ))
    }

    /// Moves leadership to `target` (this client must talk to the leader).
    pub fn move_leader(&self, target: MemberId) -> Result<(), EtcdError> {
        self.call(
            "move leader",
            "/v3/maintenance/transfer-leadership",
            &json!({"targetID": target.0.to_string()}),
        )
        .map(drop)
    }
}

/// How a membership step reads etcd's refusal of its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// What the call asked for holds already (its first answer was lost): done.
    Done,
    /// etcd will allow it later (a learner catching up, its quorum protection): wait.
    Wait,
    /// It never will: the step fails.
    Final,
}

/// Runs one membership call until it is done, within `deadline`: each round tries every
/// endpoint in turn, moving on from one that is unreachable, times out or answers something
/// unreadable; a refusal is read by `read`; between rounds it waits `every`. Every call it runs
/// is idempotent (`read` says when a refusal means it is done already), so a call whose answer
/// was lost may be made again. A deadline of zero is one round.
fn until_done(
    clients: &[Etcd],
    mut call: impl FnMut(&Etcd) -> Result<(), EtcdError>,
    read: impl Fn(&str) -> Refusal,
    every: Duration,
    deadline: Duration,
    waiting: &str,
) -> Result<(), EtcdError> {
    let start = Instant::now();
    loop {
        let mut last = None;
        for client in clients {
            match call(client) {
                Ok(()) => return Ok(()),
                Err(EtcdError::Refused { call, message }) => match read(&message) {
                    Refusal::Done => {
                        crate::log::log_info!("{waiting}: done already ({message})");
                        return Ok(());
                    }
                    Refusal::Final => return Err(EtcdError::Refused { call, message }),
                    // etcd itself answered: another endpoint would say the same.
                    Refusal::Wait => {
                        last = Some(EtcdError::Refused { call, message });
                        break;
                    }
                },
                Err(e) => last = Some(e),
            }
        }
        let e = last.unwrap_or_else(no_endpoint);
        if start.elapsed() + every >= deadline {
            return Err(e);
        }
        crate::log::log_info!("{waiting}: {e}");
        std::thread::sleep(every);
    }
}

/// Reads a refusal saying `wait` as one to wait out, and one saying `done` as done already
/// (`wait` is looked for first); any other as final.
fn read_as(wait: &'static str, done: &'static str) -> impl Fn(&str) -> Refusal {
    move |message| {
        if message.contains(wait) {
            Refusal::Wait
        } else if message.contains(done) {
            Refusal::Done
        } else {
            Refusal::Final
        }
    }
}

fn no_endpoint() -> EtcdError {
    EtcdError::Unreachable {
        endpoint: "(none given)".into(),
        reason: "no voter endpoint".into(),
    }
}

/// Promotes learner `id` through the first of `clients` that answers, retrying every `every`
/// while etcd says the learner is behind (or no endpoint answers), until `deadline`. A member
/// that is a voter already is done.
pub fn promote_when_caught_up(
    clients: &[Etcd],
    id: MemberId,
    every: Duration,
    deadline: Duration,
) -> Result<(), EtcdError> {
    until_done(
        clients,
        |client| client.promote(id),
        // A learner behind says both; a voter only the second.
        read_as("in sync with leader", "can only promote a learner member"),
        every,
        deadline,
        &format!("learner {id} is catching up"),
    )
}

/// Removes member `id` through the first of `clients` that answers, retrying every `every`
/// while etcd says the removal would leave too few members connected for long enough (its
/// quorum protection) or no endpoint answers, until `deadline`. A member etcd does not know is
/// gone already.
pub fn remove_when_safe(
    clients: &[Etcd],
    id: MemberId,
    every: Duration,
    deadline: Duration,
) -> Result<(), EtcdError> {
    until_done(
        clients,
        |client| client.remove(id),
        read_as("unhealthy cluster", "member not found"),
        every,
        deadline,
        &format!("member {id} cannot go yet"),
    )
}

/// The member list from the first of `clients` (voters; a learner refuses membership calls)
/// that answers, each tried in turn every `every` until `deadline`.
fn any_voter(
    clients: &[Etcd],
    every: Duration,
    deadline: Duration,
) -> Result<Vec<Member>, EtcdError> {
    let mut found = None;
    until_done(
        clients,
        |client| {
            found = Some(client.members()?);
            Ok(())
        },
        |_| Refusal::Final,
        every,
        deadline,
        "listing etcd's members",
    )?;
    found.ok_or_else(no_endpoint)
}

/// How long a join waits while etcd refuses to add a member to a cluster whose members have
/// not all been connected for a while (its quorum protection, e.g. right after a promotion).
const ADD_PATIENCE: Duration = Duration::from_secs(120);

/// A joining node adds itself: as a learner with `peer_url`, through the first voter that
/// answers — unless etcd lists that peer URL already (a join retried after a crash, or an add
/// whose answer was lost: each attempt lists the members first, so it may be made again).
pub fn join(clients: &[Etcd], peer_url: &str) -> Result<MemberId, EtcdError> {
    let mut joined = None;
    until_done(
        clients,
        |client| {
            let members = client.members()?;
            if let Some(me) = members
                .iter()
                .find(|m| m.peer_urls.iter().any(|u| u == peer_url))
            {
                crate::log::log_info!("etcd lists {peer_url} as member {}", me.id);
                joined = Some(me.id);
                return Ok(());
            }
            let id = client.add_learner(peer_url)?;
            crate::log::log_info!("added {peer_url} as learner {id}");
            joined = Some(id);
            Ok(())
        },
        |message| {
            if message.contains("unhealthy cluster") {
                Refusal::Wait
            } else {
                Refusal::Final
            }
        },
        Duration::from_secs(2),
        ADD_PATIENCE,
        &format!("{peer_url} cannot be added yet"),
    )?;
    joined.ok_or_else(no_endpoint)
}

/// Why a join could not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("etcd does not list {0} (the join never started)")]
    NotListed(String),
    /// The learner did not catch up in time and was removed again, so it never holds quorum
    /// hostage; `removal` says if that removal failed too.
    #[error("the learner {peer_url} did not catch up within {secs}s ({reason}); {removal}")]
    Withdrawn {
        peer_url: String,
        secs: u64,
        reason: String,
        removal: String,
    },
}

/// Promotes this node's learner once it has caught up, retrying until `deadline`; a learner
/// still behind then is removed. A member already a voter is done.
pub fn promote_or_withdraw(
    clients: &[Etcd],
    peer_url: &str,
    every: Duration,
    deadline: Duration,
) -> Result<(), JoinError> {
    let start = Instant::now();
    let members = any_voter(clients, every, deadline)?;
    let me = members
        .iter()
        .find(|m| m.peer_urls.iter().any(|u| u == peer_url))
        .ok_or_else(|| JoinError::NotListed(peer_url.to_owned()))?;
    if !me.is_learner {
        return Ok(());
    }
    match promote_when_caught_up(
        clients,
        me.id,
        every,
        deadline.saturating_sub(start.elapsed()),
    ) {
        Ok(()) => {
            crate::log::log_info!("learner {} promoted to voter", me.id);
            Ok(())
        }
        Err(e) => {
            // Each endpoint once: the step's time is spent.
            let removal = match remove_when_safe(clients, me.id, every, Duration::ZERO) {
                Ok(()) => "it was removed".to_owned(),
                Err(r) => format!("removing it failed too: {r}"),
            };
            Err(JoinError::Withdrawn {
                peer_url: peer_url.to_owned(),
                secs: deadline.as_secs(),
                reason: e.to_string(),
                removal,
            })
        }
    }
}

/// Moves leadership from `me` (the member `leaving` talks to) to `target`, within `deadline`.
/// etcd's gateway keeps a transfer's call waiting until the target leads, even after raft gave
/// the transfer up (a target that has not applied its own promotion yet ignores it, and the
/// leader abandons it after an election timeout), so a call that fails or times out is followed
/// by a look at who leads now, and made again every `every`. Done once `me` no longer leads.
pub fn move_leadership(
    leaving: &Etcd,
    me: MemberId,
    target: MemberId,
    every: Duration,
    deadline: Duration,
) -> Result<(), EtcdError> {
    let start = Instant::now();
    loop {
        let Err(e) = leaving.move_leader(target) else {
            return Ok(());
        };
        // Its answer lost, or the transfer given up: who leads now? (0 while nobody does.)
        if let Ok((_, leader)) = leaving.status() {
            if leader != me && leader != MemberId(0) {
                crate::log::log_info!("leadership moved from {me} to {leader} ({e})");
                return Ok(());
            }
        }
        let again = match &e {
            EtcdError::Refused { message, .. } => message.contains("leader transfer took too long"),
            EtcdError::Unreachable { .. } | EtcdError::Unreadable { .. } => true,
        };
        if !again || start.elapsed() + every >= deadline {
            return Err(e);
        }
        crate::log::log_info!("leadership is still with {me}: {e}");
        std::thread::sleep(every);
    }
}

/// Removes the member with `peer_url` — leadership moved off it first through `leaving` (its
/// own endpoint; skipped when it does not answer: a dead member leads nothing) — through the
/// first of `remaining` that answers, retried while etcd's quorum protection refuses, until
/// `deadline`. A member etcd does not list is gone already.
pub fn remove_member(
    remaining: &[Etcd],
    leaving: &Etcd,
    peer_url: &str,
    every: Duration,
    deadline: Duration,
) -> Result<(), EtcdError> {
    let start = Instant::now();
    let members = any_voter(remaining, every, deadline)?;
    let Some(member) = members
        .iter()
        .find(|m| m.peer_urls.iter().any(|u| u == peer_url))
    else {
        crate::log::log_info!("etcd no longer lists {peer_url}");
        return Ok(());
    };
    if let Ok((me, leader)) = leaving.status() {
        if me == leader {
            if let Some(target) = members.iter().find(|m| m.id != me && !m.is_learner) {
                // Half the time left at most: the removal itself must still fit.
                let within = deadline.saturating_sub(start.elapsed()) / 2;
                match move_leadership(leaving, me, target.id, every, within) {
                    Ok(()) => crate::log::log_info!("leadership moved from {me} to {}", target.id),
                    // etcd removes a leader too (it steps down once the removal commits and
                    // the others elect one): the step goes on, at the cost of one election.
                    Err(e) => crate::log::log_warn!(
                        "leadership did not move from {me} to {} ({e}); removing the leader itself",
                        target.id
                    ),
                }
            }
        }
    }
    remove_when_safe(
        remaining,
        member.id,
        every,
        deadline.saturating_sub(start.elapsed()),
    )?;
    crate::log::log_info!("member {} ({peer_url}) removed", member.id);
    Ok(())
}
