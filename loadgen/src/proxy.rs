//! Injected network latency: a loopback TCP proxy that holds every chunk it forwards, in both
//! directions, for a fixed delay. Put between the API and PostgreSQL it makes every query round
//! trip at least twice the delay slower — a slow or distant database, without touching either.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// Listens on a free loopback port and forwards each connection to `upstream` (host:port).
pub(crate) async fn start(upstream: String, delay: Duration) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::join!(
                    pump(client_read, server_write, delay),
                    pump(server_read, client_write, delay)
                );
            });
        }
    });
    Ok(address)
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tokio::time::sleep(delay).await;
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// `postgres://user@HOST:PORT/db?…` as (everything before HOST, `HOST:PORT`, the rest).
fn parts(url: &str) -> Result<(&str, &str, &str), String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err("--db-latency-ms needs a postgres:// --database-url".into());
    }
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[scheme_end..]
        .find(['/', '?'])
        .map_or(url.len(), |i| scheme_end + i);
    let host_start = url[scheme_end..authority_end]
        .rfind('@')
        .map_or(scheme_end, |i| scheme_end + i + 1);
    let host_port = &url[host_start..authority_end];
    if host_port.is_empty() {
        return Err("--db-latency-ms needs a host in --database-url".into());
    }
    Ok((&url[..host_start], host_port, &url[authority_end..]))
}

/// The `host:port` a PostgreSQL URL points at (port 5432 when absent).
pub(crate) fn upstream(url: &str) -> Result<String, String> {
    let (_, host_port, _) = parts(url)?;
    Ok(if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    })
}

/// The same URL pointed at `address` instead.
pub(crate) fn through(url: &str, address: SocketAddr) -> Result<String, String> {
    let (before, _, after) = parts(url)?;
    Ok(format!("{before}{address}{after}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rerouting_replaces_only_the_host_and_port() {
        let proxy: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        let url = "postgres://postgres@127.0.0.1:5432/db?sslmode=disable";
        assert_eq!(upstream(url).unwrap(), "127.0.0.1:5432");
        assert_eq!(
            through(url, proxy).unwrap(),
            "postgres://postgres@127.0.0.1:6000/db?sslmode=disable"
        );
        assert_eq!(
            upstream("postgresql://db.internal/x").unwrap(),
            "db.internal:5432"
        );
        assert_eq!(
            through("postgres://db.internal", proxy).unwrap(),
            "postgres://127.0.0.1:6000"
        );
        assert!(upstream("sqlite://x.db").is_err());
        assert!(upstream("postgres:///db").is_err());
    }
}
