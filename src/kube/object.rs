//! Kubernetes objects behind etcd keys: kube-apiserver stores each object under
//! `/registry/[<group>/]<resource>/[<namespace>/]<name>`, as protobuf (`k8s\0` then a
//! `runtime.Unknown`: field 1 TypeMeta {apiVersion 1, kind 2}, field 2 the object, whose field 1
//! is its ObjectMeta {name 1, namespace 3}) or as JSON (custom resources). Values encrypted at
//! rest (`k8s:enc:`) say nothing; the key still gives the resource and the name.

use serde::Serialize;

use crate::format::proto::fields;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Object {
    /// The kind from the value (`Secret`), or the resource from the key (`secrets`) when the
    /// value does not say (encrypted at rest).
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// The object behind `key`, if it is a Kubernetes key.
pub fn describe(key: &[u8], value: &[u8]) -> Option<Object> {
    let path = std::str::from_utf8(key).ok()?.strip_prefix("/registry/")?;
    if let Some(o) = from_protobuf(value).or_else(|| from_json(value)) {
        return Some(o);
    }
    // Encrypted or unknown: the key says it all, `[<group>/]<resource>/[<namespace>/]<name>`
    // (a group has dots, a resource none).
    let parts: Vec<&str> = path.split('/').collect();
    let at = parts.iter().position(|p| !p.contains('.')).unwrap_or(0);
    let (namespace, name) = match &parts[at + 1..] {
        [ns, name] => (Some((*ns).to_owned()), (*name).to_owned()),
        [.., name] => (None, (*name).to_owned()),
        [] => (None, parts[at].to_owned()),
    };
    Some(Object {
        kind: parts[at].to_owned(),
        namespace,
        name,
    })
}

fn text(b: &[u8]) -> Option<String> {
    std::str::from_utf8(b).ok().map(str::to_owned)
}

fn from_protobuf(value: &[u8]) -> Option<Object> {
    let unknown = fields(value.strip_prefix(b"k8s\0")?)?;
    let type_meta = unknown.iter().find(|f| f.0 == 1 && f.1 == 2)?.3;
    let kind = text(fields(type_meta)?.iter().find(|f| f.0 == 2 && f.1 == 2)?.3)?;
    let raw = unknown.iter().find(|f| f.0 == 2 && f.1 == 2)?.3;
    let meta = fields(fields(raw)?.iter().find(|f| f.0 == 1 && f.1 == 2)?.3)?;
    let name = text(meta.iter().find(|f| f.0 == 1 && f.1 == 2)?.3)?;
    let namespace = meta
        .iter()
        .find(|f| f.0 == 3 && f.1 == 2)
        .and_then(|f| text(f.3))
        .filter(|n| !n.is_empty());
    Some(Object {
        kind,
        namespace,
        name,
    })
}

fn from_json(value: &[u8]) -> Option<Object> {
    if value.first() != Some(&b'{') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    Some(Object {
        kind: v["kind"].as_str()?.to_owned(),
        namespace: v["metadata"]["namespace"].as_str().map(str::to_owned),
        name: v["metadata"]["name"].as_str()?.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(out: &mut Vec<u8>, n: u8, b: &[u8]) {
        out.push(n << 3 | 2);
        out.push(b.len() as u8);
        out.extend_from_slice(b);
    }

    #[test]
    fn kind_namespace_and_name_come_from_the_value_or_else_the_key() {
        let mut meta = Vec::new();
        field(&mut meta, 1, b"db-password");
        field(&mut meta, 3, b"shop");
        let mut obj = Vec::new();
        field(&mut obj, 1, &meta);
        let mut tm = Vec::new();
        field(&mut tm, 1, b"v1");
        field(&mut tm, 2, b"Secret");
        let mut v = b"k8s\0".to_vec();
        field(&mut v, 1, &tm);
        field(&mut v, 2, &obj);
        let o = describe(b"/registry/secrets/shop/db-password", &v).unwrap();
        assert_eq!(o.to_string(), "Secret shop/db-password");

        let json = br#"{"kind":"Widget","metadata":{"name":"w1","namespace":"ns"}}"#;
        let o = describe(b"/registry/example.com/widgets/ns/w1", json).unwrap();
        assert_eq!(o.to_string(), "Widget ns/w1");

        // Encrypted at rest: the key's namespace and name.
        let enc = b"k8s:enc:aescbc:v1:key1:xxxx";
        let o = describe(b"/registry/secrets/shop/db-password", enc).unwrap();
        assert_eq!(o.to_string(), "secrets shop/db-password");
        let o = describe(b"/registry/namespaces/shop", enc).unwrap();
        assert_eq!(o.to_string(), "namespaces shop");
        let o = describe(
            b"/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com",
            enc,
        )
        .unwrap();
        assert_eq!(o.to_string(), "customresourcedefinitions widgets.example.com");
        let o = describe(b"/registry/example.com/widgets/ns/w1", enc).unwrap();
        assert_eq!(o.to_string(), "widgets ns/w1");
        assert!(describe(b"/other/x", b"").is_none());
    }
}
