//! Kyverno libraries: image references (`parseImageReference`/`image`, `isImage` and the
//! members of the image object) and the host-backed verification / image-data functions.

use cel::common::value::CowVal;
use cel::objects::Opaque;
use cel::{ExecutionError, FunctionContext, Value};

use super::{FunctionError, Registry, call_values, no_overload, opaque, string, wrap};
use crate::activation::{HostOp, call_host};
use crate::image::ImageReference;

pub(super) const IMAGE_TYPE: &str = "kyverno.image";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Image(pub ImageReference);

impl Opaque for Image {
    fn runtime_type_name(&self) -> &str {
        IMAGE_TYPE
    }
}

pub(super) fn to_string(o: &dyn Opaque) -> Option<String> {
    o.downcast_ref::<Image>().map(|i| i.0.original().to_owned())
}

fn parse(a: &[Value]) -> Option<Result<Value, FunctionError>> {
    match a {
        [Value::String(s)] => Some(
            ImageReference::parse(s)
                .map(|r| wrap(Image(r)))
                .map_err(FunctionError::from),
        ),
        _ => None,
    }
}

fn member(a: &[Value], f: fn(&ImageReference) -> Value) -> Option<Result<Value, FunctionError>> {
    match a {
        [v] => opaque::<Image>(v).map(|i| Ok(f(&i.0))),
        _ => None,
    }
}

pub(super) fn register(r: &mut Registry) {
    r.add("parseImageReference", parse);
    r.add("image", parse);
    r.add("isImage", |a| match a {
        [Value::String(s)] => Some(Ok(Value::Bool(ImageReference::parse(s).is_ok()))),
        _ => None,
    });
    r.add("registry", |a| member(a, |i| string(i.registry())));
    r.add("repository", |a| member(a, |i| string(i.repository())));
    r.add("identifier", |a| member(a, |i| string(i.identifier())));
    r.add("tag", |a| {
        member(a, |i| string(i.tag().unwrap_or_default()))
    });
    r.add("digest", |a| {
        member(a, |i| string(i.digest().unwrap_or_default()))
    });
    r.add("containsDigest", |a| {
        member(a, |i| Value::Bool(i.digest().is_some()))
    });

    r.add_raw(
        "verifyImageSignatures",
        host_fn(HostOp::VerifyImageSignatures),
    );
    r.add_raw(
        "verifyAttestationSignatures",
        host_fn(HostOp::VerifyAttestationSignatures),
    );
    r.add_raw("extractPayload", host_fn(HostOp::ExtractPayload));
    r.add_raw("getImageData", host_fn(HostOp::ImageData));
    r.add_raw("image.GetMetadata", host_fn(HostOp::ImageData));
    r.add_raw("image.getMetadata", host_fn(HostOp::ImageData));
}

/// Whether `args` fit the declared signature of `op`.
fn signature_ok(op: HostOp, args: &[Value]) -> bool {
    use Value::{List, String as S};
    match op {
        HostOp::VerifyImageSignatures => matches!(args, [S(_), List(_)]),
        HostOp::VerifyAttestationSignatures => matches!(args, [S(_), S(_), List(_)]),
        HostOp::ExtractPayload => matches!(args, [S(_), S(_)]),
        HostOp::ImageData => matches!(args, [S(_)]),
        // Declared by the `resources` module, with their own signatures.
        HostOp::ResourceGet | HostOp::ResourceList | HostOp::GlobalContext | HostOp::WallTime => {
            false
        }
    }
}

fn host_fn(op: HostOp) -> super::Func {
    Box::new(move |ftx: &mut FunctionContext<'_, '_>| {
        if ftx.this.is_some() {
            return Err(ExecutionError::not_supported_as_method(
                op.function_name(),
                Value::Null,
            ));
        }
        let args = call_values(ftx)?;
        if !signature_ok(op, &args) {
            return Err(no_overload(op.function_name(), &args, false));
        }
        let value = call_host(ftx, op, args)?;
        value.try_into().map(CowVal::Owned)
    })
}
