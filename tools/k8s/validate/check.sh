#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests (tools/k8s):
#   1. every overlay renders with `kubectl kustomize`;
#   2. every rendered object type-checks against the Kubernetes API types of
#      the pinned kubernetes-models package: generate.js writes each object as
#      a typed object literal and `tsc --strict` rejects unknown (misspelt)
#      fields and wrong types; each model's validate() then checks the API's
#      JSON schema (required fields, formats);
#   3. the fixtures under fixtures/ (a misspelt field, a wrong type, ...) must
#      FAIL that check, so that the check is known to catch them.
# The npm packages are installed with `npm ci` from package-lock.json into a
# cache outside the source tree (MONSOON_K8S_VALIDATE_CACHE, default
# ~/.cache/monsoon-k8s-validate/<lock hash>). Skips, with a message, where
# kubectl or node/npm are missing. Exit 0 when everything holds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k8s="$(dirname "$here")"

if ! command -v kubectl >/dev/null; then
  echo "k8s-validate: SKIPPED: kubectl is not installed (cannot render)"
  exit 0
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "k8s-validate: SKIPPED: node and npm are not installed"
  exit 0
fi

lock_hash=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)
cache="${MONSOON_K8S_VALIDATE_CACHE:-$HOME/.cache/monsoon-k8s-validate}/$lock_hash"
if [ ! -x "$cache/node_modules/.bin/tsc" ]; then
  mkdir -p "$cache"
  cp "$here/package.json" "$here/package-lock.json" "$cache/"
  (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error)
fi
cp "$here/generate.js" "$cache/"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# check NAME YAML: 0 when every object in YAML passes both checks.
check() {
  local name="$1" yaml="$2" dir="$work/$1"
  mkdir -p "$dir"
  node "$cache/generate.js" "$yaml" "$cache/$name.ts" || return 1
  if ! (cd "$cache" && node_modules/.bin/tsc --strict --target es2019 \
      --module commonjs --moduleResolution node --outDir "$dir" \
      "$name.ts") > "$dir/tsc.log" 2>&1; then
    sed "s|^|  $name: |" "$dir/tsc.log" | head -20
    return 1
  fi
  if ! NODE_PATH="$cache/node_modules" node "$dir/$name.js" > "$dir/validate.log" 2>&1; then
    sed "s|^|  $name: |" "$dir/validate.log" | head -20
    return 1
  fi
}

status=0
for overlay in "$k8s"/overlays/*/; do
  name=$(basename "$overlay")
  if ! kubectl kustomize "$overlay" > "$work/$name.yaml" 2> "$work/$name.err"; then
    echo "k8s-validate: FAIL: overlay $name does not render:"
    cat "$work/$name.err"
    status=1
    continue
  fi
  objects=$(grep -c '^kind:' "$work/$name.yaml" || true)
  if check "overlay-$name" "$work/$name.yaml"; then
    echo "k8s-validate: ok: overlay $name renders, $objects objects type-check and validate"
  else
    echo "k8s-validate: FAIL: overlay $name"
    status=1
  fi
done
for fixture in "$here"/fixtures/*.yaml; do
  name=$(basename "$fixture" .yaml)
  if out=$(check "fixture-$name" "$fixture" 2>&1); then
    echo "k8s-validate: FAIL: broken fixture $name passed the check"
    status=1
  else
    echo "k8s-validate: ok: broken fixture $name is rejected:"
    echo "$out" | head -2
  fi
done
exit $status
