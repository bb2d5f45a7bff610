//! A minimal HTTP/1.1 client over hyper: one keep-alive connection, one request at a
//! time, as one simulated user of the embeddings server. Shared by
//! `examples/loadgen.rs` and `tests/serve.rs`.
#![allow(dead_code)]

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{handshake, SendRequest};
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

/// The `host:port` of an `http://host:port[/...]` URL.
pub fn host_port(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("the URL must start with http:// (got `{url}`)"))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() || !host.contains(':') {
        return Err(format!("the URL must name host:port (got `{url}`)"));
    }
    Ok(host.to_string())
}

/// One open connection to `host:port`.
pub struct Conn {
    host: String,
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    /// Connects to `host` (`host:port`).
    pub async fn connect(host: &str) -> Result<Conn, String> {
        let stream = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|e| format!("cannot connect to {host}: {e}"))?;
        stream.set_nodelay(true).ok();
        let (sender, conn) = handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {host}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            host: host.to_string(),
            sender,
        })
    }

    /// Sends `method path` with `body` (JSON when not empty) and returns the status
    /// and the whole response body.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Bytes), String> {
        let (status, _, body) = self.send(method, path, body, &[]).await?;
        Ok((status, body))
    }

    /// [`Conn::request`] with extra request `headers`, returning the response's
    /// headers too.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, HeaderMap, Bytes), String> {
        self.sender
            .ready()
            .await
            .map_err(|e| format!("connection to {}: {e}", self.host))?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host)
            .header("content-type", "application/json");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("building the request: {e}"))?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{path}: reading the body: {e}"))?
            .to_bytes();
        Ok((status, headers, body))
    }
}
