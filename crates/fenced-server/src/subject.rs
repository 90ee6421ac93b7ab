//! A client certificate's subject as an identity's name for it (`cert_subject`): the
//! distinguished name in RFC 4514's string form, most specific first (`CN=billing,O=Acme`
//! for OpenSSL's `-subj "/O=Acme/CN=billing"`), in one canonical spelling so that the
//! configuration and the certificate compare as strings: attribute types by their short
//! names in capitals (`CN`, `O`, `OU`, `C`, `L`, `ST`, `STREET`, `DC`, `UID`,
//! `EMAILADDRESS`) or as dotted numbers, no spaces around `=`, `,` and `+`, the values of a
//! multi-valued RDN in order, RFC 4514's escapes. The certificate is trusted already (the
//! TLS handshake verified it against `client_ca`); this only reads its name, with
//! `yasna`'s DER reader.

use yasna::models::ObjectIdentifier;
use yasna::{ASN1Result, BERReader, Tag};

/// The longest subject taken, in bytes.
pub const SUBJECT_BYTES_MAX: usize = 1024;

const NAMES: [(&[u64], &str); 10] = [
    (&[2, 5, 4, 3], "CN"),
    (&[2, 5, 4, 6], "C"),
    (&[2, 5, 4, 7], "L"),
    (&[2, 5, 4, 8], "ST"),
    (&[2, 5, 4, 9], "STREET"),
    (&[2, 5, 4, 10], "O"),
    (&[2, 5, 4, 11], "OU"),
    (&[0, 9, 2342, 19200300, 100, 1, 25], "DC"),
    (&[0, 9, 2342, 19200300, 100, 1, 1], "UID"),
    (&[1, 2, 840, 113549, 1, 9, 1], "EMAILADDRESS"),
];

/// One attribute, canonical: `TYPE=escaped value`.
fn attribute(kind: &str, value: &str) -> String {
    format!("{kind}={}", escape(value))
}

/// RFC 4514, 2.4: the specials, and a leading `#` or space, a trailing space.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn type_name(oid: &ObjectIdentifier) -> String {
    let parts = oid.components();
    match NAMES.iter().find(|(o, _)| *o == parts.as_slice()) {
        Some((_, name)) => (*name).to_owned(),
        None => parts.iter().map(u64::to_string).collect::<Vec<_>>().join("."),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The subject of a DER certificate, canonical; `None` if it cannot be read (or is
/// longer than [`SUBJECT_BYTES_MAX`]).
pub fn of_certificate(der: &[u8]) -> Option<String> {
    let tbs = yasna::parse_der(der, |r| {
        r.read_sequence(|r| {
            let tbs = r.next().read_der()?;
            r.next().read_der()?;
            r.next().read_der()?;
            Ok(tbs)
        })
    })
    .ok()?;
    let subject = yasna::parse_der(&tbs, |r| {
        r.read_sequence(|r| {
            // version [0] EXPLICIT, optional; serial; signature; issuer; validity.
            r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der()))?;
            for _ in 0..4 {
                r.next().read_der()?;
            }
            let subject = read_name(r.next())?;
            while r.read_optional(|r| r.read_der())?.is_some() {}
            Ok(subject)
        })
    })
    .ok()?;
    (subject.len() <= SUBJECT_BYTES_MAX).then_some(subject)
}

/// Name ::= SEQUENCE OF RDN; RDN ::= SET OF SEQUENCE { type OID, value ANY }.
fn read_name(r: BERReader<'_, '_>) -> ASN1Result<String> {
    let mut rdns: Vec<String> = Vec::new();
    r.read_sequence_of(|r| {
        let mut values = Vec::new();
        r.read_set_of(|r| {
            let (kind, value) = r.read_sequence(|r| {
                let kind = type_name(&r.next().read_oid()?);
                let value = r.next().read_tagged_der()?;
                Ok((kind, value))
            })?;
            values.push(match value.as_str() {
                Some(s) => attribute(&kind, s),
                // Not a string type read here (a BMPString, say): RFC 4514's hex form.
                None => format!("{kind}=#{}", hex(value.value())),
            });
            Ok(())
        })?;
        values.sort();
        rdns.push(values.join("+"));
        Ok(())
    })?;
    rdns.reverse();
    Ok(rdns.join(","))
}

/// A `cert_subject` as configured, in the canonical spelling; an error says what is
/// wrong with it.
pub fn canonical(configured: &str) -> Result<String, String> {
    if configured.len() > SUBJECT_BYTES_MAX {
        return Err(format!("cert_subject is longer than {SUBJECT_BYTES_MAX} bytes"));
    }
    let mut rdns: Vec<Vec<String>> = vec![Vec::new()];
    let mut piece = String::new();
    let mut chars = configured.chars();
    let end_piece = |piece: &mut String, rdns: &mut Vec<Vec<String>>| -> Result<(), String> {
        let (kind, value) =
            piece.split_once('=').ok_or_else(|| format!("cert_subject '{configured}': '{piece}' is not TYPE=value"))?;
        let kind = kind.trim().to_ascii_uppercase();
        let kind = match NAMES.iter().find(|(_, n)| *n == kind) {
            Some((_, n)) => (*n).to_owned(),
            None if !kind.is_empty()
                && kind.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) =>
            {
                kind
            }
            None => return Err(format!("cert_subject '{configured}': unknown attribute type '{kind}'")),
        };
        let value = unescape(value.trim_start())?;
        if value.is_empty() {
            return Err(format!("cert_subject '{configured}': {kind} has no value"));
        }
        rdns.last_mut().expect("one at least").push(attribute(&kind, &value));
        piece.clear();
        Ok(())
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                piece.push('\\');
                piece.push(chars.next().ok_or_else(|| format!("cert_subject '{configured}' ends in a lone '\\'"))?);
            }
            ',' | '+' => {
                end_piece(&mut piece, &mut rdns)?;
                if c == ',' {
                    rdns.push(Vec::new());
                }
            }
            c => piece.push(c),
        }
    }
    end_piece(&mut piece, &mut rdns)?;
    Ok(rdns
        .into_iter()
        .map(|mut values| {
            values.sort();
            values.join("+")
        })
        .collect::<Vec<_>>()
        .join(","))
}

/// A value with RFC 4514's backslash escapes undone (and unescaped trailing spaces cut).
fn unescape(value: &str) -> Result<String, String> {
    let trimmed = value.trim_end();
    let kept =
        if trimmed.ends_with('\\') && trimmed.len() < value.len() { &value[..trimmed.len() + 1] } else { trimmed };
    let mut out = String::new();
    let mut chars = kept.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let next = chars.next().ok_or("a value ends in a lone '\\'")?;
            if next.is_ascii_hexdigit() {
                return Err("hex escapes (\\2C) are not taken in cert_subject: write the character after a '\\'".into());
            }
            out.push(next);
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_subject_has_one_spelling() {
        assert_eq!(canonical("CN=billing").unwrap(), "CN=billing");
        assert_eq!(canonical(" cn = billing , o=Acme Corp").unwrap(), "CN=billing,O=Acme Corp");
        assert_eq!(canonical("CN=a\\,b,OU=x+CN=y").unwrap(), "CN=a\\,b,CN=y+OU=x");
        assert_eq!(canonical("2.5.4.3=billing").unwrap(), "2.5.4.3=billing");
        assert_eq!(canonical("emailAddress=a@b").unwrap(), "EMAILADDRESS=a@b");
        for bad in ["billing", "XX=billing", "CN=", "CN=a\\", "CN=a\\2Cb", "CN=a,,O=b"] {
            assert!(canonical(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_certificates_subject_reads_most_specific_first() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "Acme, Inc");
        params.distinguished_name.push(rcgen::DnType::CommonName, "billing");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let subject = of_certificate(cert.der().as_ref()).expect("a subject");
        assert_eq!(subject, "CN=billing,O=Acme\\, Inc");
        assert_eq!(canonical("CN=billing, O=Acme\\, Inc").unwrap(), subject);
        assert_eq!(of_certificate(b"not a certificate"), None);
        assert_eq!(of_certificate(&cert.der().as_ref()[..cert.der().len() / 2]), None);
    }
}
