#!/usr/bin/env bash
# Check the deployment manifests and the monitoring rules (what CI runs, .ci/run):
#   1. the kustomize overlays render to the committed deploy/kubernetes/rendered/*.yaml (when
#      kubectl, which embeds kustomize, is on PATH; without it the committed renders are checked)
#   2. every core resource validates with `kubernetes-validate --strict` at Kubernetes $K8S_VERSION
#   3. the RayService validates against KubeRay's own CRD schema (vendored, deploy/kubernetes/crd/)
#      with check-jsonschema, strict (unknown fields refused)
#   4. `promtool check rules` + `promtool test rules` on deploy/observability/prometheus/
# The validators live in their own venv ($DEPLOY_VENV, outside the clone; pinned by
# deploy/requirements-validate.txt). Usage: scripts/check-deploy.sh [--render] (rewrite the renders)
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION=${K8S_VERSION:-1.32.0}
DEPLOY_VENV=${DEPLOY_VENV:-$HOME/.cache/loraplex/deploy-venv}
K=deploy/kubernetes
OVERLAYS=(one-process kuberay)

req_hash=$(sha256sum deploy/requirements-validate.txt | cut -c1-16)
if [ ! -f "$DEPLOY_VENV/.stamp-$req_hash" ]; then
    python3 -m venv "$DEPLOY_VENV"
    "$DEPLOY_VENV/bin/pip" install --quiet --disable-pip-version-check -r deploy/requirements-validate.txt
    touch "$DEPLOY_VENV/.stamp-$req_hash"
fi
PY="$DEPLOY_VENV/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
    for o in "${OVERLAYS[@]}"; do
        kubectl kustomize "$K/overlays/$o" >"$work/$o.yaml"
        if [ "${1:-}" = --render ]; then
            cp "$work/$o.yaml" "$K/rendered/$o.yaml"
        elif ! diff -u "$K/rendered/$o.yaml" "$work/$o.yaml"; then
            echo "check-deploy: $K/rendered/$o.yaml is stale: run scripts/check-deploy.sh --render" >&2
            exit 1
        fi
    done
    echo "kustomize: ${OVERLAYS[*]} render as committed ($(kubectl version --client 2>/dev/null | grep -i kustomize))"
else
    echo "kustomize: kubectl not found; checking the committed renders as they are"
fi

# Split each render: core resources to kubernetes-validate, the RayService to its CRD's schema.
"$PY" - "$work" "$K/rendered" <<'PY'
import sys, yaml, pathlib
work, rendered = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
core, crds = [], []
for f in sorted(rendered.glob("*.yaml")):
    for doc in yaml.safe_load_all(f.read_text()):
        if doc:
            (crds if doc["apiVersion"].startswith("ray.io/") else core).append(doc)
for i, doc in enumerate(core):
    (work / f"core-{i:02d}-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc))
for i, doc in enumerate(crds):
    assert doc["kind"] == "RayService", doc["kind"]
    (work / f"rayservice-{i}.yaml").write_text(yaml.safe_dump(doc))
print(f"resources: {len(core)} core, {len(crds)} RayService")
PY
"$DEPLOY_VENV/bin/kubernetes-validate" --strict -k "$K8S_VERSION" "$work"/core-*.yaml
"$PY" "$K/crd/rayservice_schema.py" >"$work/rayservice.schema.json"
"$DEPLOY_VENV/bin/check-jsonschema" --schemafile "$work/rayservice.schema.json" "$work"/rayservice-*.yaml

if command -v promtool >/dev/null; then
    (cd deploy/observability/prometheus && promtool check rules loraplex-rules.yml && promtool test rules loraplex-rules.test.yml)
    promtool check config deploy/observability/prometheus/prometheus.yml
elif [ "${LORAPLEX_REQUIRE_PROMETHEUS:-0}" = 1 ]; then
    echo "check-deploy: promtool missing (apt-get install prometheus)" >&2
    exit 1
else
    echo "check-deploy: promtool not installed; rules not checked"
fi
echo "check-deploy: all checks passed"
