//! One apiserver's `/readyz`, asked as a cloud load balancer's health check asks it: anonymous,
//! over TLS that verifies the apiserver's certificate for the address dialled against the
//! cluster CA (every apiserver certificate exk8s signs names its member's address), one
//! request per connection. Only the status line matters: 200 is ready, anything else — or no
//! answer within the timeout — is not.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;

use super::pool::Readiness;

/// The most of an answer read while looking for the end of its head.
const MAX_HEAD: usize = 16 * 1024;

/// TLS trusting exactly the CA certificates in `ca_pem` (two during a CA rotation).
pub(super) fn tls(ca_pem: &[u8]) -> Result<Arc<ClientConfig>, String> {
    crate::http::private_ca_tls(ca_pem, "the cluster CA file").map_err(|e| e.to_string())
}

/// Asks `addr`'s `/readyz`, giving each step (connect, handshake, each read) `timeout`.
pub(super) fn check(addr: SocketAddr, tls: &Arc<ClientConfig>, timeout: Duration) -> Readiness {
    match ask(addr, tls, timeout) {
        Ok(200) => Readiness::Ready,
        Ok(status) => Readiness::NotReady(format!("/readyz answered HTTP {status}")),
        Err(why) => Readiness::NotReady(why),
    }
}

fn ask(addr: SocketAddr, tls: &Arc<ClientConfig>, timeout: Duration) -> Result<u16, String> {
    let tcp = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    for set in [TcpStream::set_read_timeout, TcpStream::set_write_timeout] {
        set(&tcp, Some(timeout)).map_err(|e| format!("socket: {e}"))?;
    }
    let name = ServerName::IpAddress(addr.ip().into());
    let conn =
        rustls::ClientConnection::new(Arc::clone(tls), name).map_err(|e| format!("TLS: {e}"))?;
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: exk8s-apiserver-balancer\r\n\
         Accept: text/plain\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("TLS: {e}"))?;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 1024];
    loop {
        let read = stream
            .read(&mut chunk)
            .map_err(|e| format!("reading: {e}"))?;
        if read == 0 {
            return Err("the connection closed before an answer".to_owned());
        }
        head.extend_from_slice(&chunk[..read]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&head) {
            Ok(httparse::Status::Complete(_)) => {
                return response
                    .code
                    .ok_or_else(|| "an answer with no status".to_owned());
            }
            Ok(httparse::Status::Partial) if head.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(format!("no end of the answer's head in {MAX_HEAD} bytes"));
            }
            Err(e) => return Err(format!("not an HTTP answer: {e}")),
        }
    }
}
