//! Why a request failed below HTTP, decided once from the typed error chain.
//!
//! reqwest, hyper, the resolver and rustls each wrap the error of the layer below. Decisions
//! (whether a TLS failure came from a plain-HTTP server, which words a person reads) are made
//! on the types found in that chain — [`rustls::Error`], [`std::io::ErrorKind`],
//! [`hyper::Error`], ivory's own [`LookupFailed`] and [`RedirectRefusal`] — never on its text.

use std::error::Error as StdError;
use std::io;

/// What made a request fail before the registry could answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportCause {
    /// The registry's host name did not resolve.
    DnsLookupFailed,
    /// The registry's host resolves only to addresses ivory's egress rule refuses
    /// (link-local, cloud metadata, unspecified, ...).
    AddressRefused,
    /// Nothing listens on the registry's port.
    ConnectionRefused,
    /// The connection or the request timed out.
    TimedOut,
    /// The registry reset the connection.
    ConnectionReset,
    /// The registry closed the connection before answering.
    ConnectionClosed,
    /// No route to the registry's network.
    NetworkUnreachable,
    /// No route to the registry's host.
    HostUnreachable,
    /// The registry's certificate chains to no trusted root.
    CertificateUnknownIssuer,
    /// The registry's certificate does not name the host.
    CertificateNotValidForName,
    /// The registry's certificate has expired.
    CertificateExpired,
    /// The registry's certificate was refused for another reason.
    CertificateRejected,
    /// The peer's first bytes are not a TLS record: it most likely speaks plain HTTP.
    PeerNotTls,
    /// Another TLS failure (alert, incompatible peer).
    Tls,
    /// Nothing in the chain says more.
    Other,
}

impl TransportCause {
    /// Classifies `err` by the first layer of its chain that says something definite.
    pub fn of(err: &(dyn StdError + 'static)) -> Self {
        let mut found = TransportCause::Other;
        walk(err, &mut |layer| {
            found = classify_layer(layer);
            found != TransportCause::Other
        });
        found
    }

    /// The cause in a few words, for a person: `DNS lookup failed`.
    pub fn describe(self) -> &'static str {
        match self {
            TransportCause::DnsLookupFailed => "DNS lookup failed",
            TransportCause::AddressRefused => "the address is refused by ivory's egress rule",
            TransportCause::ConnectionRefused => "connection refused",
            TransportCause::TimedOut => "connection timed out",
            TransportCause::ConnectionReset => "connection reset",
            TransportCause::ConnectionClosed => "connection closed by the registry",
            TransportCause::NetworkUnreachable => "network unreachable",
            TransportCause::HostUnreachable => "no route to host",
            TransportCause::CertificateUnknownIssuer => {
                "TLS certificate signed by an unknown authority"
            }
            TransportCause::CertificateNotValidForName => {
                "TLS certificate not valid for this host name"
            }
            TransportCause::CertificateExpired => "TLS certificate expired",
            TransportCause::CertificateRejected => "TLS certificate rejected",
            TransportCause::PeerNotTls => "TLS handshake failed: the registry may serve plain HTTP",
            TransportCause::Tls => "TLS handshake failed",
            TransportCause::Other => "transport failure",
        }
    }
}

/// ivory's resolver found no address for a host (the resolver's own words go to the log).
#[derive(Debug, thiserror::Error)]
#[error("no address found for {host}")]
pub struct LookupFailed {
    /// The host name that did not resolve.
    pub host: String,
    /// The system resolver's error.
    #[source]
    pub source: io::Error,
}

/// The egress rule refused every address of a host (a name's resolved addresses, or a literal
/// redirect target).
#[derive(Debug, thiserror::Error)]
#[error("{host} is at {ip}, {class}: ivory does not connect there")]
pub struct AddressRefused {
    /// The host name (or the literal address).
    pub host: String,
    /// The first refused address.
    pub ip: std::net::IpAddr,
    /// Its class.
    pub class: ivory_reference::AddressClass,
}

impl AddressRefused {
    pub(crate) fn new(host: String, refusal: ivory_reference::EgressRefusal) -> Self {
        Self {
            host,
            ip: refusal.ip,
            class: refusal.class,
        }
    }

    /// The egress rule's refusal this error carries.
    pub fn refusal(&self) -> ivory_reference::EgressRefusal {
        ivory_reference::EgressRefusal {
            ip: self.ip,
            class: self.class,
        }
    }

    /// The refusal in `err`'s chain, if any.
    pub(crate) fn of<'e>(err: &'e (dyn StdError + 'static)) -> Option<&'e AddressRefused> {
        let mut found = None;
        walk(err, &mut |layer| {
            found = layer.downcast_ref::<AddressRefused>();
            found.is_some()
        });
        found
    }
}

/// Why ivory's redirect policy refused to follow a registry's redirect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RedirectRefusal {
    /// More hops than `client::http::MAX_REDIRECTS`.
    #[error("too many redirects")]
    TooMany,
    /// To a URL whose scheme is not http(s).
    #[error("to a non-HTTP URL")]
    NotHttp,
    /// From HTTPS to plain HTTP.
    #[error("from HTTPS to plain HTTP")]
    Downgrade,
}

impl RedirectRefusal {
    /// The refusal ivory's redirect policy put in `err`'s chain, if any.
    pub(crate) fn of(err: &(dyn StdError + 'static)) -> Option<Self> {
        let mut found = None;
        walk(err, &mut |layer| {
            found = layer.downcast_ref::<RedirectRefusal>().copied();
            found.is_some()
        });
        found
    }
}

/// Calls `visit` on every layer of `err`'s chain until it returns true. An `io::Error`
/// wrapping another error hides that error from `source()` (it answers the inner error's
/// source instead), so the walk steps into the wrapped error itself.
fn walk<'e>(
    err: &'e (dyn StdError + 'static),
    visit: &mut dyn FnMut(&'e (dyn StdError + 'static)) -> bool,
) {
    let mut current = Some(err);
    while let Some(layer) = current {
        if visit(layer) {
            return;
        }
        current = match layer
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => layer.source(),
        };
    }
}

fn classify_layer(layer: &(dyn StdError + 'static)) -> TransportCause {
    if layer.is::<LookupFailed>() {
        return TransportCause::DnsLookupFailed;
    }
    if layer.is::<AddressRefused>() {
        return TransportCause::AddressRefused;
    }
    if let Some(tls) = layer.downcast_ref::<rustls::Error>() {
        return of_tls(tls);
    }
    if let Some(io) = layer.downcast_ref::<io::Error>() {
        return of_io_kind(io.kind());
    }
    if let Some(http) = layer.downcast_ref::<hyper::Error>() {
        if http.is_timeout() {
            return TransportCause::TimedOut;
        }
        if http.is_incomplete_message() || http.is_closed() || http.is_canceled() {
            return TransportCause::ConnectionClosed;
        }
    }
    if layer
        .downcast_ref::<reqwest::Error>()
        .is_some_and(reqwest::Error::is_timeout)
    {
        return TransportCause::TimedOut;
    }
    TransportCause::Other
}

fn of_tls(err: &rustls::Error) -> TransportCause {
    use rustls::CertificateError as C;
    match err {
        rustls::Error::InvalidMessage(_) => TransportCause::PeerNotTls,
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer => TransportCause::CertificateUnknownIssuer,
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                TransportCause::CertificateNotValidForName
            }
            C::Expired | C::ExpiredContext { .. } => TransportCause::CertificateExpired,
            _ => TransportCause::CertificateRejected,
        },
        _ => TransportCause::Tls,
    }
}

fn of_io_kind(kind: io::ErrorKind) -> TransportCause {
    use io::ErrorKind as K;
    match kind {
        K::ConnectionRefused => TransportCause::ConnectionRefused,
        K::TimedOut => TransportCause::TimedOut,
        K::ConnectionReset => TransportCause::ConnectionReset,
        K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => TransportCause::ConnectionClosed,
        K::NetworkUnreachable => TransportCause::NetworkUnreachable,
        K::HostUnreachable => TransportCause::HostUnreachable,
        _ => TransportCause::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer layer")]
    struct Outer(#[source] Box<dyn StdError + Send + Sync>);

    /// As rustls errors reach reqwest: inside an `InvalidData` io::Error inside another.
    fn wrapped(inner: impl StdError + Send + Sync + 'static) -> Outer {
        let tls = io::Error::new(io::ErrorKind::InvalidData, inner);
        Outer(Box::new(io::Error::other(tls)))
    }

    #[test]
    fn a_tls_error_inside_an_io_error_is_found_by_type() {
        let cases = [
            (
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
                TransportCause::PeerNotTls,
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
                TransportCause::CertificateUnknownIssuer,
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::Expired),
                TransportCause::CertificateExpired,
            ),
            (
                rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature),
                TransportCause::CertificateRejected,
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure),
                TransportCause::Tls,
            ),
        ];
        for (tls, want) in cases {
            assert_eq!(TransportCause::of(&wrapped(tls)), want);
        }
    }

    #[test]
    fn words_in_an_error_message_decide_nothing() {
        // Text that names every cause ivory knows, but no typed layer: nothing definite.
        let text =
            io::Error::other("InvalidContentType corrupt message dns error connection refused");
        assert_eq!(
            TransportCause::of(&Outer(Box::new(text))),
            TransportCause::Other
        );
    }

    #[test]
    fn io_kinds_and_ivory_errors_classify() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            TransportCause::of(&Outer(Box::new(refused))),
            TransportCause::ConnectionRefused
        );
        let lookup = LookupFailed {
            host: "r.invalid".into(),
            source: io::Error::other("Name or service not known"),
        };
        assert_eq!(
            TransportCause::of(&Outer(Box::new(lookup))),
            TransportCause::DnsLookupFailed
        );
        let metadata = AddressRefused {
            host: "metadata.internal".into(),
            ip: "169.254.169.254".parse().unwrap(),
            class: ivory_reference::AddressClass::LinkLocal,
        };
        assert_eq!(
            TransportCause::of(&Outer(Box::new(metadata))),
            TransportCause::AddressRefused
        );
        let redirect = Outer(Box::new(RedirectRefusal::Downgrade));
        assert_eq!(
            RedirectRefusal::of(&redirect),
            Some(RedirectRefusal::Downgrade)
        );
        assert_eq!(
            RedirectRefusal::of(&Outer(Box::new(io::Error::other("x")))),
            None
        );
    }
}
