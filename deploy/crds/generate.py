#!/usr/bin/env python3
"""Writes the ImageValidatingPolicy and NamespacedImageValidatingPolicy CRDs.

The spec schema is written once here and emitted for every served version of both kinds, so the
versions cannot drift. It follows Kyverno's generated CRD (the field tree that
crates/ivory-policy/src/types.rs models) plus the admissionregistration.k8s.io/v1
MatchResources / MatchCondition and metav1 LabelSelector / Condition schemas.

    python3 deploy/crds/generate.py          # rewrite the YAML here and in helm/ivory/crds/
    python3 deploy/crds/generate.py --check  # exit 1 when the files are out of date

Standard library only (no PyYAML): a small emitter writes block-style YAML.
"""

import json
import re
import sys
from pathlib import Path

GROUP = "policies.kyverno.io"
STORAGE_VERSION = "v1beta1"
# The kustomize base reads the first, the Helm chart the second (Helm installs crds/ as they are).
OUT_DIRS = [Path(__file__).resolve().parent,
            Path(__file__).resolve().parent.parent / "helm" / "ivory" / "crds"]

# (kind, plural, short name, scope, versions). Kyverno serves v1alpha1 (deprecated) only for the
# cluster-scoped kind: NamespacedImageValidatingPolicy was added in v1beta1 (Kyverno 1.16).
KINDS = [
    ("ImageValidatingPolicy", "imagevalidatingpolicies", "ivpol", "Cluster",
     ["v1", "v1beta1", "v1alpha1"]),
    ("NamespacedImageValidatingPolicy", "namespacedimagevalidatingpolicies", "nivpol",
     "Namespaced", ["v1", "v1beta1"]),
]
DEPRECATED_VERSIONS = {"v1alpha1"}


# --- schema helpers -------------------------------------------------------------------------

def obj(props, required=None, desc=None, **extra):
    s = {}
    if desc:
        s["description"] = desc
    s["type"] = "object"
    s["properties"] = dict(sorted(props.items()))
    if required:
        s["required"] = sorted(required)
    s.update(extra)
    return s


def arr(items, desc=None, **extra):
    s = {}
    if desc:
        s["description"] = desc
    s["type"] = "array"
    s["items"] = items
    s.update(extra)
    return s


def string(desc=None, **extra):
    s = {"description": desc} if desc else {}
    s["type"] = "string"
    s.update(extra)
    return s


def boolean(desc=None, **extra):
    s = {"description": desc} if desc else {}
    s["type"] = "boolean"
    s.update(extra)
    return s


def string_map(desc=None):
    s = {"description": desc} if desc else {}
    s["type"] = "object"
    s["additionalProperties"] = {"type": "string"}
    return s


def one_of_required(*keys):
    return [{"required": [k]} for k in keys]


def atomic_strings(desc=None):
    return arr(string(), desc, **{"x-kubernetes-list-type": "atomic"})


# --- Kubernetes types -----------------------------------------------------------------------

def label_selector(desc):
    requirement = obj(
        {
            "key": string("The label key that the selector applies to."),
            "operator": string("In, NotIn, Exists or DoesNotExist."),
            "values": atomic_strings("Non-empty for In/NotIn, empty for Exists/DoesNotExist."),
        },
        required=["key", "operator"],
    )
    return obj(
        {
            "matchExpressions": arr(requirement, "Label selector requirements (ANDed).",
                                    **{"x-kubernetes-list-type": "atomic"}),
            "matchLabels": string_map("Map of {key,value} pairs, each an In requirement."),
        },
        desc=desc,
        **{"x-kubernetes-map-type": "atomic"},
    )


def named_rule_with_operations():
    return obj(
        {
            "apiGroups": atomic_strings("API groups the resources belong to; '*' is all groups."),
            "apiVersions": atomic_strings("API versions the resources belong to; '*' is all."),
            "operations": atomic_strings(
                "CREATE, UPDATE, DELETE, CONNECT or '*' for all of them."),
            "resourceNames": atomic_strings("Optional white list of names; empty means all."),
            "resources": atomic_strings("Resources this rule applies to ('pods', 'pods/log', '*')."),
            "scope": string("Cluster, Namespaced or '*' (the default)."),
        },
        **{"x-kubernetes-map-type": "atomic"},
    )


def match_resources():
    rules = lambda d: arr(named_rule_with_operations(), d,  # noqa: E731
                          **{"x-kubernetes-list-type": "atomic"})
    return obj(
        {
            "excludeResourceRules": rules("Operations on resources the policy must not care about."),
            "matchPolicy": string("Exact or Equivalent (the default)."),
            "namespaceSelector": label_selector(
                "Runs the policy only for objects in namespaces matching this selector."),
            "objectSelector": label_selector(
                "Runs the policy only for objects whose labels match this selector."),
            "resourceRules": rules("Operations on resources the policy cares about."),
        },
        desc="Resources the policy applies to (admissionregistration.k8s.io/v1 MatchResources).",
        **{"x-kubernetes-map-type": "atomic"},
    )


def name_expression(desc, item_desc_name, item_desc_expr):
    return arr(
        obj(
            {"expression": string(item_desc_expr), "name": string(item_desc_name)},
            required=["expression", "name"],
        ),
        desc,
    )


def condition():
    """metav1.Condition."""
    return obj(
        {
            "lastTransitionTime": string("When the condition last changed status.",
                                         format="date-time"),
            "message": string("Human readable details.", maxLength=32768),
            "observedGeneration": {"description": ".metadata.generation the condition was set on.",
                                   "type": "integer", "format": "int64", "minimum": 0},
            "reason": string("CamelCase reason for the last transition.", maxLength=1024,
                             minLength=1, pattern="^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
            "status": string("True, False or Unknown.", enum=["True", "False", "Unknown"]),
            "type": string("Condition type in CamelCase or foo.example.com/CamelCase.",
                           maxLength=316,
                           pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*"
                                   r"[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"),
        },
        required=["lastTransitionTime", "message", "reason", "status", "type"],
    )


# --- ImageValidatingPolicy spec -------------------------------------------------------------

def value_or_expression(desc):
    return obj(
        {"expression": string("CEL expression returning the value."),
         "value": string("The value, inline.")},
        desc=desc,
        oneOf=one_of_required("value", "expression"),
    )


def cosign():
    return obj(
        {
            "annotations": string_map("Annotations the signature must carry."),
            "certificate": obj(
                {
                    "cert": value_or_expression("PEM certificate the signature was made with."),
                    "certChain": value_or_expression("PEM chain of that certificate."),
                },
                desc="Certificate-based verification.",
            ),
            "ctlog": obj(
                {
                    "ctLogPubKey": string("PEM public key of the certificate transparency log."),
                    "insecureIgnoreSCT": boolean("Skip the signed certificate timestamp check."),
                    "insecureIgnoreTlog": boolean("Skip the transparency log (Rekor) check."),
                    "rekorPubKey": string("PEM public key of the Rekor log."),
                    "tsaCertChain": string("PEM chain of the timestamp authority."),
                    "url": string("Rekor URL."),
                },
                desc="Transparency log options.",
            ),
            "key": obj(
                {
                    "data": string("PEM public key."),
                    "expression": string("CEL expression returning a PEM public key."),
                    "hashAlgorithm": string("sha224, sha256 (default), sha384 or sha512."),
                    "kms": string("KMS key URI."),
                },
                desc="Public-key verification.",
            ),
            "keyless": obj(
                {
                    "additionalExtensions": string_map("Certificate extensions to match."),
                    "identities": arr(
                        obj({
                            "issuer": string("Exact OIDC issuer."),
                            "issuerRegExp": string("OIDC issuer regular expression."),
                            "subject": string("Exact certificate subject."),
                            "subjectExpression": string("CEL expression for the subject."),
                            "subjectRegExp": string("Certificate subject regular expression."),
                        }),
                        "Accepted identities; any one may match.",
                    ),
                    "roots": string("PEM Fulcio roots."),
                },
                required=["identities"],
                desc="Keyless (Fulcio) verification.",
            ),
            "source": obj(
                {
                    # Kyverno's Go field has no json tag, hence the capital P.
                    "PullSecrets": arr(
                        obj({"name": string("Secret name.", default="")},
                            **{"x-kubernetes-map-type": "atomic"}),
                        "Secrets used to read the signature repository.",
                    ),
                    "repository": string("Repository the signatures are stored in."),
                    "tagPrefix": string("Prefix of the signature tags."),
                },
                desc="Where signatures are stored when not beside the image.",
            ),
            "trustedRoot": value_or_expression("Sigstore trusted root JSON."),
            "tuf": obj(
                {
                    "mirror": string("TUF mirror URL."),
                    "root": obj(
                        {"data": string("Base64 TUF root."), "path": string("TUF root file path.")},
                        desc="Initial TUF root.",
                    ),
                },
                desc="TUF options for the Sigstore trust material.",
            ),
        },
        desc="Cosign attestor.",
    )


def spec(desc):
    attestor = obj(
        {
            "cosign": cosign(),
            "name": string("Name referenced from CEL as attestors.<name>."),
            "notary": obj(
                {
                    "certs": value_or_expression("PEM certificates trusted for signatures."),
                    "tsaCerts": value_or_expression("PEM certificates of the timestamp authority."),
                },
                desc="Notary attestor.",
            ),
        },
        required=["name"],
        oneOf=one_of_required("cosign", "notary"),
    )
    type_ref = lambda d: obj({"type": string(d)}, required=["type"])  # noqa: E731
    props = {
        "attestations": arr(
            obj(
                {
                    "intoto": type_ref("in-toto predicate type."),
                    "name": string("Name referenced from CEL as attestations.<name>."),
                    "referrer": type_ref("OCI referrer artifactType."),
                },
                required=["name"],
            ),
            "Attestations the validations may check.",
        ),
        "attestors": arr(attestor, "Trusted signers."),
        "auditAnnotations": arr(
            obj(
                {"key": string("Audit annotation key."),
                 "valueExpression": string("CEL expression producing the value.")},
                required=["key", "valueExpression"],
            ),
            "Audit annotations added to the audit event.",
            **{"x-kubernetes-list-type": "atomic"},
        ),
        "autogen": obj(
            {"podControllers": obj(
                {"controllers": arr(string(), "Pod controllers; [] disables autogen.")},
                desc="Pod controller autogen.",
            )},
            desc="Rules generated for pod controllers.",
        ),
        "credentials": obj(
            {
                "allowInsecureRegistry": boolean("Allow plain HTTP registries."),
                "providers": arr(
                    string(enum=["default", "amazon", "azure", "google", "github"]),
                    "Credential helpers.",
                ),
                "secrets": arr(string(), "dockerconfigjson Secrets (name or namespace/name)."),
            },
            desc="Registry credentials; replaces the global ones.",
        ),
        "evaluation": obj(
            {
                "admission": obj({"enabled": boolean("Evaluate at admission.", default=True)}),
                "background": obj({"enabled": boolean("Evaluate in background scans.",
                                                      default=True)}),
                "mode": string("Kubernetes (default) or JSON."),
            },
            desc="Evaluation options.",
        ),
        "failurePolicy": string("Fail (default) or Ignore.", enum=["Ignore", "Fail"]),
        "images": name_expression("Custom image extractors.", "Extractor name.",
                                  "CEL expression returning image references."),
        "matchConditions": name_expression(
            "CEL conditions that must all hold for the policy to apply (MatchCondition).",
            "Identifier of the condition.", "CEL expression returning a bool."),
        "matchConstraints": match_resources(),
        "matchImageReferences": arr(
            obj(
                {"expression": string("CEL expression over the image reference."),
                 "glob": string("Glob over the image reference.")},
                oneOf=one_of_required("glob", "expression"),
            ),
            "Which images the policy verifies.",
        ),
        "validationActions": arr(
            string(enum=["Deny", "Audit", "Warn"]),
            "Actions on a failed validation (default [Deny]).",
            **{"x-kubernetes-list-type": "set"},
        ),
        "validationConfigurations": obj(
            {
                "mutateDigest": boolean("Pin images to digests.", default=True),
                "required": boolean("Every matched image must be verified.", default=True),
                "verifyDigest": boolean("Every matched image must use a digest.", default=True),
            },
            desc="Digest and verification requirements.",
            default={},
        ),
        "validations": arr(
            obj(
                {
                    "expression": string("CEL expression returning a bool."),
                    "message": string("Message when the expression is false."),
                    "messageExpression": string("CEL expression for the message."),
                    "reason": string("Reason (accepted, unused)."),
                },
                required=["expression"],
            ),
            "CEL validations.",
            **{"x-kubernetes-list-type": "atomic"},
        ),
        "variables": name_expression("CEL variables.", "Variable name.", "CEL expression."),
        "webhookConfiguration": obj(
            {"timeoutSeconds": {"description": "Webhook timeout.", "type": "integer",
                                "format": "int32"}},
            desc="Webhook options.",
        ),
    }
    return obj(props, required=["attestors", "validations"], desc=desc)


def status():
    target = obj(
        {"group": string(), "kind": string(), "resource": string(), "version": string()},
        required=["group", "kind", "resource", "version"],
    )
    autogen_config = obj(
        {"spec": spec("Generated spec."), "targets": arr(target, "Generated targets.")},
        required=["targets"],
    )
    return obj(
        {
            "autogen": obj(
                {"configs": {"type": "object", "additionalProperties": autogen_config}},
                desc="Autogenerated pod controller rules.",
            ),
            "conditionStatus": obj(
                {
                    "conditions": arr(condition(), "Conditions (WebhookConfigured, ...).",
                                      **{"x-kubernetes-list-map-keys": ["type"],
                                         "x-kubernetes-list-type": "map"}),
                    "message": string("Summary message."),
                    "ready": boolean("True when the policy is ready."),
                },
            ),
        },
        desc="Observed state; ivory does not write it.",
    )


def version_entry(version):
    schema = obj(
        {
            "apiVersion": string("Versioned schema of this representation of an object."),
            "kind": string("REST resource this object represents."),
            "metadata": {"type": "object"},
            "spec": spec("Policy behaviour."),
            "status": status(),
        },
        required=["spec"],
    )
    entry = {
        "name": version,
        "served": True,
        "storage": version == STORAGE_VERSION,
    }
    if version in DEPRECATED_VERSIONS:
        entry["deprecated"] = True
        entry["deprecationWarning"] = (
            f"{GROUP}/{version} is deprecated; use {GROUP}/v1")
    entry["additionalPrinterColumns"] = [
        {"jsonPath": ".metadata.creationTimestamp", "name": "AGE", "type": "date"},
        {"jsonPath": ".status.conditionStatus.ready", "name": "READY", "type": "string"},
    ]
    entry["schema"] = {"openAPIV3Schema": schema}
    entry["subresources"] = {"status": {}}
    return entry


def crd(kind, plural, short, scope, versions):
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "ivory"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "categories": ["kyverno"],
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "shortNames": [short],
                "singular": kind.lower(),
            },
            "scope": scope,
            "conversion": {"strategy": "None"},
            "versions": [version_entry(v) for v in versions],
        },
    }


# --- YAML emitter ---------------------------------------------------------------------------

PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_ ./,()'<>=\[\]-]*$")
RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def scalar(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if PLAIN.match(v) and v.lower() not in RESERVED and not v.endswith(" ") and "[" not in v[:1]:
        return v
    return json.dumps(v)


def emit(v, indent=0):
    pad = " " * indent
    lines = []
    if isinstance(v, dict):
        for k, x in v.items():
            if isinstance(x, (dict, list)) and x:
                lines.append(f"{pad}{scalar(k)}:")
                lines.extend(emit(x, indent + (2 if isinstance(x, dict) else 0)))
            else:
                lines.append(f"{pad}{scalar(k)}: {inline(x)}")
    else:
        for x in v:
            if isinstance(x, (dict, list)) and x:
                sub = emit(x, indent + 2)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {inline(x)}")
    return lines


def inline(x):
    if isinstance(x, dict):
        return "{}"
    if isinstance(x, list):
        return "[]"
    return scalar(x)


def render(kind, plural, short, scope, versions):
    head = ("# Generated by deploy/crds/generate.py; edit that script, not this file.\n"
            "---\n")
    return head + "\n".join(emit(crd(kind, plural, short, scope, versions))) + "\n"


def main(argv):
    check = "--check" in argv[1:]
    stale = []
    for kind, plural, short, scope, versions in KINDS:
        text = render(kind, plural, short, scope, versions)
        for out_dir in OUT_DIRS:
            path = out_dir / f"{GROUP}_{plural}.yaml"
            if check:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path))
            else:
                path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python3 deploy/crds/generate.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
