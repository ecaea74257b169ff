//! OpenSSL's own RFC 3161 timestamp authority (`openssl ts -reply`), set up as its manual
//! shows: a TSA certificate (timestamping usage) under a root of its own, and the `certs` chain
//! file holding the TSA certificate and the root, so a token that asks for certificates carries
//! the TSA certificate twice (as signer, and again from the chain file).

use std::path::Path;
use std::process::Command;

use crate::error::{Error, Result, io};

/// The TSA's key type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TsaKey {
    /// RSA 3072.
    Rsa,
    /// ECDSA P-256.
    EcP256,
}

/// An OpenSSL TSA in a temporary directory.
pub struct OpensslTsa {
    dir: tempfile::TempDir,
    /// The TSA's root certificate (PEM): what a verifier trusts (`tsaCerts`).
    pub root_pem: String,
    /// The TSA's own certificate (PEM).
    pub tsa_pem: String,
}

impl OpensslTsa {
    /// A root and a TSA certificate of `key` under it, valid from now for a year.
    pub fn new(key: TsaKey) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ivory-tsa-")
            .tempdir()
            .map_err(io("creating the TSA directory"))?;
        let d = dir.path();
        let new_key = match key {
            TsaKey::Rsa => "rsa:3072",
            TsaKey::EcP256 => "ec",
        };
        let root = [
            "req",
            "-x509",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "root.key",
            "-out",
            "root.pem",
            "-days",
            "3650",
            "-subj",
            "/CN=ivory OpenSSL TSA root",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ];
        openssl(d, &root)?;
        let mut csr = vec!["req", "-new", "-newkey", new_key];
        if key == TsaKey::EcP256 {
            csr.extend(["-pkeyopt", "ec_paramgen_curve:P-256"]);
        }
        csr.extend([
            "-nodes",
            "-keyout",
            "tsa.key",
            "-out",
            "tsa.csr",
            "-subj",
            "/CN=ivory OpenSSL TSA",
        ]);
        openssl(d, &csr)?;
        write(
            d,
            "tsa.ext",
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=critical,timeStamping\n",
        )?;
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "tsa.csr",
                "-CA",
                "root.pem",
                "-CAkey",
                "root.key",
                "-CAcreateserial",
                "-days",
                "365",
                "-sha256",
                "-extfile",
                "tsa.ext",
                "-out",
                "tsa.pem",
            ],
        )?;
        let read = |name: &str| {
            std::fs::read_to_string(d.join(name)).map_err(io(format!("reading {name}")))
        };
        let (root_pem, tsa_pem) = (read("root.pem")?, read("tsa.pem")?);
        // The chain file as OpenSSL's manual writes it: the TSA certificate, then its root.
        write(d, "chain.pem", &format!("{tsa_pem}{root_pem}"))?;
        write(d, "tsaserial", "01\n")?;
        write(
            d,
            "tsa.cnf",
            &format!(
                "[ tsa ]\ndefault_tsa = ivory_tsa\n[ ivory_tsa ]\ndir = {}\n\
                 serial = $dir/tsaserial\nsigner_cert = $dir/tsa.pem\ncerts = $dir/chain.pem\n\
                 signer_key = $dir/tsa.key\nsigner_digest = sha256\n\
                 default_policy = 1.3.6.1.4.1.57264.2\ndigests = sha256, sha384, sha512\n\
                 accuracy = secs:1\nordering = no\ntsa_name = no\n\
                 ess_cert_id_chain = no\ness_cert_id_alg = sha256\n",
                d.display()
            ),
        )?;
        Ok(Self {
            dir,
            root_pem,
            tsa_pem,
        })
    }

    /// A TimeStampToken (DER CMS ContentInfo, as Notation carries it) over the SHA-256 of
    /// `data`, with the TSA's certificates (`openssl ts -query -cert`).
    pub fn token(&self, data: &[u8]) -> Result<Vec<u8>> {
        self.reply(data, true)
    }

    /// A TimeStampResp (DER, status and token, as a Sigstore bundle carries it) over the
    /// SHA-256 of `data`, with the TSA's certificates.
    pub fn response(&self, data: &[u8]) -> Result<Vec<u8>> {
        self.reply(data, false)
    }

    /// What `openssl ts -verify` says of the TimeStampToken `token` over `data`, with the
    /// TSA's root trusted: OpenSSL's own verdict, an oracle for a token ivory rewrote.
    pub fn verifies(&self, token: &[u8], data: &[u8]) -> Result<bool> {
        let d = self.dir.path();
        std::fs::write(d.join("check.der"), token).map_err(io("writing the token"))?;
        std::fs::write(d.join("check.data"), data).map_err(io("writing the data"))?;
        let out = Command::new("openssl")
            .args([
                "ts",
                "-verify",
                "-token_in",
                "-in",
                "check.der",
                "-data",
                "check.data",
            ])
            .args(["-CAfile", "root.pem"])
            .current_dir(d)
            .output()
            .map_err(io("running openssl ts -verify"))?;
        Ok(out.status.success())
    }

    fn reply(&self, data: &[u8], token_only: bool) -> Result<Vec<u8>> {
        let d = self.dir.path();
        std::fs::write(d.join("data"), data).map_err(io("writing the data to stamp"))?;
        openssl(
            d,
            &[
                "ts",
                "-query",
                "-data",
                "data",
                "-sha256",
                "-cert",
                "-no_nonce",
                "-out",
                "request.tsq",
            ],
        )?;
        let mut reply = vec![
            "ts",
            "-reply",
            "-config",
            "tsa.cnf",
            "-queryfile",
            "request.tsq",
            "-out",
            "reply.der",
        ];
        if token_only {
            reply.push("-token_out");
        }
        openssl(d, &reply)?;
        std::fs::read(d.join("reply.der")).map_err(io("reading the TSA's reply"))
    }
}

fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    std::fs::write(dir.join(name), text).map_err(io(format!("writing {name}")))
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(io("running openssl"))?;
    if !out.status.success() {
        return Err(Error::Pki(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}
