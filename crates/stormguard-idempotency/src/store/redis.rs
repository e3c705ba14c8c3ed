//! The Redis store: `SET NX PX` to create a record, Lua scripts to compare-and-set it.
//!
//! A record is one string value under `<prefix><tenant length>:<tenant>:<key>`:
//!
//! ```text
//! [state: 1 char][lease token: 16 hex][lease until: 16 hex][expires at: 16 hex][fingerprint: 64 hex][payload]
//! ```
//!
//! - **begin** is one Lua script, one round trip for a new key and for a replay alike: it
//!   creates the record with `SET NX PX` when there is none; otherwise it reads it and decides
//!   (replay, in flight, mismatch), and *replaces* it only after comparing: a record past its
//!   retention, or an in-flight record whose lease has expired (take-over, which installs the
//!   new fencing token).
//! - **complete** and **release** are compare-and-set / compare-and-delete scripts on the
//!   state and the lease token. No code path sends a plain `SET` that could overwrite an
//!   in-flight record it does not hold.
//! - **retention**: every write sets `PX` to the time left until the record's retention ends,
//!   so Redis drops it by itself; the scripts also compare the stored times with the caller's
//!   clock, so leases and expiry follow the layer's [`WallClock`](stormguard::deadline::WallClock) (and a
//!   manual clock in tests). [`reap`](crate::Store::reap) walks the key space with `SCAN` in
//!   bounded steps and deletes records that are logically expired but not yet dropped.

use std::collections::VecDeque;
use std::time::Duration;

use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Mutex;

use crate::Store;
use crate::store::codec;
use crate::store::{
    Begin, BeginRequest, Completion, Finish, LeaseToken, Millis, Reaped, ScopedKey, StoreError,
    StoreFuture,
};

const BEGIN_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'acquired'}
end
local now = tonumber(ARGV[3])
if tonumber(string.sub(v, 34, 49), 16) <= now then
  redis.call('SET', KEYS[1], ARGV[1], 'XX', 'PX', ARGV[2])
  return {'acquired'}
end
if string.sub(v, 50, 113) ~= ARGV[4] then return {'mismatch'} end
if string.sub(v, 1, 1) ~= '0' then return {'completed', v} end
local lease = string.sub(v, 18, 33)
if tonumber(lease, 16) > now then return {'inflight', lease} end
redis.call('SET', KEYS[1], ARGV[1], 'XX', 'PX', ARGV[2])
return {'takeover'}
"#;

const COMPLETE_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, 1) ~= '0' or string.sub(v, 2, 17) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2] .. string.sub(v, 50, 113) .. ARGV[3], 'XX', 'PX', ARGV[4])
return 1
"#;

const RELEASE_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, 1) ~= '0' or string.sub(v, 2, 17) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

const REAP_LUA: &str = r#"
local now = tonumber(ARGV[1])
local n = 0
for _, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v then
    local exp = tonumber(string.sub(v, 34, 49), 16)
    if exp and exp <= now then
      redis.call('DEL', k)
      n = n + 1
    end
  end
end
return n
"#;

/// The most `SCAN` calls one reap pass makes, so a large key space with few of our keys
/// still costs a bounded amount per pass.
const SCANS_PER_PASS: usize = 8;

/// Idempotency records in Redis.
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    begin: Script,
    complete: Script,
    release: Script,
    reap: Script,
    scan: Mutex<ScanState>,
}

#[derive(Default)]
struct ScanState {
    cursor: u64,
    pending: VecDeque<String>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://127.0.0.1:6379/0`) with a connection manager that
    /// reconnects by itself; every key this store writes starts with `prefix` (for example
    /// `"idem:"`).
    ///
    /// Commands time out after 5 s and a lost connection is retried twice before an error is
    /// reported, so a dead server fails requests (closed) quickly instead of hanging them.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(StoreError::backend)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(StoreError::backend)?;
        Ok(Self::from_manager(conn, prefix))
    }

    /// A store on an existing connection manager.
    pub fn from_manager(conn: ConnectionManager, prefix: &str) -> Self {
        RedisStore {
            conn,
            prefix: prefix.to_owned(),
            begin: Script::new(BEGIN_LUA),
            complete: Script::new(COMPLETE_LUA),
            release: Script::new(RELEASE_LUA),
            reap: Script::new(REAP_LUA),
            scan: Mutex::new(ScanState::default()),
        }
    }

    /// The prefix of every key this store writes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of a record.
    pub fn redis_key(&self, key: &ScopedKey) -> String {
        format!(
            "{}{}:{}:{}",
            self.prefix,
            key.tenant().len(),
            key.tenant(),
            key.key().as_str()
        )
    }

    fn glob(&self) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 1);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('*');
        out
    }
}

fn hex16(v: i64) -> String {
    format!("{:016x}", v.max(0))
}

fn record(
    state: i64,
    token: LeaseToken,
    lease_until: Millis,
    expires_at: Millis,
    fingerprint_hex: &str,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(113 + payload.len());
    out.extend_from_slice(state.to_string().as_bytes());
    out.extend_from_slice(hex16(token.0).as_bytes());
    out.extend_from_slice(hex16(lease_until).as_bytes());
    out.extend_from_slice(hex16(expires_at).as_bytes());
    out.extend_from_slice(fingerprint_hex.as_bytes());
    out.extend_from_slice(payload);
    out
}

fn ttl(now: Millis, expires_at: Millis) -> i64 {
    expires_at.saturating_sub(now).max(1)
}

fn parse_hex(bytes: &[u8]) -> Result<i64, StoreError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| i64::from_str_radix(s, 16).ok())
        .ok_or_else(|| StoreError::Corrupt("bad number in Redis record".into()))
}

impl Store for RedisStore {
    fn begin<'a>(&'a self, req: BeginRequest<'a>) -> StoreFuture<'a, Begin> {
        Box::pin(async move {
            let key = self.redis_key(req.key);
            let fp = req.fingerprint.to_hex();
            let rec = record(
                codec::IN_FLIGHT,
                req.token,
                req.lease_until,
                req.expires_at,
                &fp,
                &[],
            );
            let px = ttl(req.now, req.expires_at);
            let mut conn = self.conn.clone();
            let reply: Vec<Vec<u8>> = self
                .begin
                .key(&key)
                .arg(&rec)
                .arg(px)
                .arg(req.now)
                .arg(&fp)
                .invoke_async(&mut conn)
                .await
                .map_err(StoreError::backend)?;
            let verdict = reply.first().map(Vec::as_slice).unwrap_or_default();
            match verdict {
                b"acquired" => Ok(Begin::Acquired { took_over: false }),
                b"takeover" => Ok(Begin::Acquired { took_over: true }),
                b"mismatch" => Ok(Begin::Mismatch),
                b"inflight" => Ok(Begin::InFlight {
                    lease_until: parse_hex(reply.get(1).map(Vec::as_slice).unwrap_or_default())?,
                }),
                b"completed" => {
                    let v = reply.get(1).map(Vec::as_slice).unwrap_or_default();
                    if v.len() < 113 {
                        return Err(StoreError::Corrupt("short Redis record".into()));
                    }
                    let state = i64::from(v[0].wrapping_sub(b'0'));
                    Ok(Begin::Completed(codec::decode_payload(state, &v[113..])?))
                }
                other => Err(StoreError::Corrupt(format!(
                    "unexpected begin reply {:?}",
                    String::from_utf8_lossy(other)
                ))),
            }
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a ScopedKey,
        token: LeaseToken,
        completion: &'a Completion,
        now: Millis,
        expires_at: Millis,
    ) -> StoreFuture<'a, Finish> {
        Box::pin(async move {
            let (state, ..) = codec::completion_columns(completion);
            // The script keeps the stored fingerprint (bytes 50..113): a completed key reused
            // with another request is still a 422.
            let mut head = record(state, token, now, expires_at, "", &[]);
            head.truncate(49);
            let rkey = self.redis_key(key);
            let mut conn = self.conn.clone();
            let done: i64 = self
                .complete
                .key(&rkey)
                .arg(hex16(token.0))
                .arg(head)
                .arg(codec::encode_payload(completion))
                .arg(ttl(now, expires_at))
                .invoke_async(&mut conn)
                .await
                .map_err(StoreError::backend)?;
            Ok(Finish::fenced(u64::try_from(done).unwrap_or(0)))
        })
    }

    fn release<'a>(&'a self, key: &'a ScopedKey, token: LeaseToken) -> StoreFuture<'a, Finish> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let done: i64 = self
                .release
                .key(self.redis_key(key))
                .arg(hex16(token.0))
                .invoke_async(&mut conn)
                .await
                .map_err(StoreError::backend)?;
            Ok(Finish::fenced(u64::try_from(done).unwrap_or(0)))
        })
    }

    fn reap(&self, now: Millis, limit: u32) -> StoreFuture<'_, Reaped> {
        Box::pin(async move {
            let limit = usize::try_from(limit.max(1)).unwrap_or(usize::MAX);
            let mut conn = self.conn.clone();
            let mut scan = self.scan.lock().await;
            let glob = self.glob();
            let mut scans = 0;
            while scan.pending.len() < limit && scans < SCANS_PER_PASS {
                let (cursor, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(scan.cursor)
                    .arg("MATCH")
                    .arg(&glob)
                    .arg("COUNT")
                    .arg(limit.max(10))
                    .query_async(&mut conn)
                    .await
                    .map_err(StoreError::backend)?;
                scans += 1;
                scan.cursor = cursor;
                scan.pending.extend(keys);
                if cursor == 0 {
                    break;
                }
            }
            let take = scan.pending.len().min(limit);
            let batch: Vec<String> = scan.pending.drain(..take).collect();
            let removed: u64 = if batch.is_empty() {
                0
            } else {
                let mut inv = self.reap.prepare_invoke();
                for k in &batch {
                    inv.key(k);
                }
                inv.arg(now)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(StoreError::backend)?
            };
            Ok(Reaped {
                removed,
                more: scan.cursor != 0 || !scan.pending.is_empty(),
            })
        })
    }
}
