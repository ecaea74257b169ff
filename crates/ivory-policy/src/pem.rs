//! PEM armour checks for key and certificate material written into policies. Only the armour and
//! the base64 body are checked here; the crypto is parsed by the verifier.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// Checks that `text` holds one or more well-formed PEM blocks and returns their labels.
/// Text outside the blocks (e.g. `openssl x509 -text` output) is tolerated, as Go's `pem.Decode` does.
pub(crate) fn check(text: &str) -> Result<Vec<String>, String> {
    let mut labels = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = armour_label(line, "BEGIN") else {
            continue;
        };
        let mut body = String::new();
        let mut closed = false;
        for inner in lines.by_ref() {
            if let Some(end) = armour_label(inner, "END") {
                if end != label {
                    return Err(format!(
                        "PEM block \"{label}\" is closed by \"-----END {end}-----\""
                    ));
                }
                closed = true;
                break;
            }
            // RFC 1421 headers (`Proc-Type: …`) carry no base64.
            if !inner.contains(':') {
                body.push_str(inner);
            }
        }
        if !closed {
            return Err(format!("PEM block \"{label}\" has no END line"));
        }
        if body.is_empty() {
            return Err(format!("PEM block \"{label}\" is empty"));
        }
        if let Err(e) = STANDARD.decode(body.as_bytes()) {
            return Err(format!("PEM block \"{label}\" is not valid base64: {e}"));
        }
        labels.push(label.to_owned());
    }
    if labels.is_empty() {
        return Err("no PEM block found (expected -----BEGIN ...-----)".to_owned());
    }
    Ok(labels)
}

/// Like [`check`], but also accepts base64-wrapped PEM (Kyverno accepts that for certificates).
pub(crate) fn check_maybe_base64(text: &str) -> Result<Vec<String>, String> {
    match check(text) {
        Ok(labels) => Ok(labels),
        Err(err) => {
            let compact: String = text.split_whitespace().collect();
            let decoded = STANDARD
                .decode(compact.as_bytes())
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok());
            match decoded {
                Some(inner) => check(&inner),
                None => Err(err),
            }
        }
    }
}

fn armour_label<'a>(line: &'a str, which: &str) -> Option<&'a str> {
    line.strip_prefix("-----")?
        .strip_prefix(which)?
        .strip_prefix(' ')?
        .strip_suffix("-----")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv\nDLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==\n-----END PUBLIC KEY-----\n";

    #[test]
    fn accepts_blocks_and_chains() {
        assert_eq!(check(KEY).unwrap(), vec!["PUBLIC KEY"]);
        let chain = format!("subject=CN=x\n{KEY}\n{KEY}");
        assert_eq!(check(&chain).unwrap().len(), 2);
    }

    #[test]
    fn accepts_base64_wrapped_pem() {
        let wrapped = STANDARD.encode(KEY);
        assert!(check(&wrapped).is_err());
        assert_eq!(check_maybe_base64(&wrapped).unwrap(), vec!["PUBLIC KEY"]);
    }

    #[test]
    fn rejects_broken_armour() {
        assert_eq!(
            check("hello").unwrap_err(),
            "no PEM block found (expected -----BEGIN ...-----)"
        );
        assert_eq!(
            check("-----BEGIN PUBLIC KEY-----\nAAAA\n").unwrap_err(),
            "PEM block \"PUBLIC KEY\" has no END line"
        );
        assert_eq!(
            check("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END CERTIFICATE-----").unwrap_err(),
            "PEM block \"PUBLIC KEY\" is closed by \"-----END CERTIFICATE-----\""
        );
        assert!(
            check("-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----")
                .unwrap_err()
                .contains("not valid base64")
        );
        assert_eq!(
            check("-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----").unwrap_err(),
            "PEM block \"PUBLIC KEY\" is empty"
        );
    }
}
