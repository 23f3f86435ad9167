#!/usr/bin/env bash
# Offline checks of the Kubernetes manifests (tools/k8s):
#   1. every overlay (and collect/, the pod that reads a finished run's
#      claims) renders with `kubectl kustomize`;
#   2. every rendered object type-checks against the Kubernetes API types of
#      the pinned kubernetes-models package: generate.js writes each object as
#      a typed object literal and `tsc --strict` rejects unknown (misspelt)
#      fields and wrong types; each model's validate() then checks the API's
#      JSON schema (required fields, formats);
#   3. policy.js checks what the types cannot: every pod non-root with a
#      read-only root, no privilege escalation, no capabilities, the runtime's
#      seccomp profile and no service account token; every daemon given the
#      run's token and (where TLS is on) its certificates from Secrets; the
#      NetworkPolicies admitting only the shards' clients (workers,
#      evaluator, finisher) to the shards; the run's label on every pod
#      template and every claim; pinned images pulled IfNotPresent; the
#      shard and worker counts agreeing everywhere;
#   4. readme.py checks the README's kubectl commands against the renders
#      (objects, label selectors, kubectl cp paths), and must reject
#      readme-fixture.md;
#   5. the fixtures under fixtures/ must FAIL those checks, each with the
#      message its "# expect:" line names, so that the checks are known to
#      catch them: a FILE.yaml is checked as it is (a misspelt field, a wrong
#      type, ...), a DIR/ is a kustomize overlay of ../../../base that breaks
#      one rule (a pod running as root, a daemon without the token, ...).
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
cp "$here/generate.js" "$here/policy.js" "$cache/"

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
  if ! NODE_PATH="$cache/node_modules" node "$cache/policy.js" "$yaml" > "$dir/policy.log" 2>&1; then
    sed "s|^|  $name: |" "$dir/policy.log" | head -20
    return 1
  fi
}

# rejected NAME YAML SOURCE: 0 when YAML fails the check with the message
# that SOURCE's "# expect:" line names.
rejected() {
  local name="$1" yaml="$2" expect out
  expect=$(sed -n 's/^# expect: //p' "$3" | head -1)
  if [ -z "$expect" ]; then
    echo "k8s-validate: FAIL: broken fixture $name has no '# expect:' line"
    return 1
  fi
  if out=$(check "fixture-$name" "$yaml" 2>&1); then
    echo "k8s-validate: FAIL: broken fixture $name passed the check"
    return 1
  fi
  if ! grep -qF -- "$expect" <<< "$out"; then
    echo "k8s-validate: FAIL: broken fixture $name failed, but not with '$expect':"
    echo "$out" | head -5
    return 1
  fi
  echo "k8s-validate: ok: broken fixture $name is rejected:"
  grep -F -- "$expect" <<< "$out" | head -1
}

status=0
for overlay in "$k8s"/overlays/*/ "$k8s"/collect/; do
  name=$(basename "$overlay")
  if ! kubectl kustomize "$overlay" > "$work/$name.yaml" 2> "$work/$name.err"; then
    echo "k8s-validate: FAIL: overlay $name does not render:"
    cat "$work/$name.err"
    status=1
    continue
  fi
  objects=$(grep -c '^kind:' "$work/$name.yaml" || true)
  if check "overlay-$name" "$work/$name.yaml"; then
    echo "k8s-validate: ok: overlay $name renders, $objects objects type-check, validate and pass the security checks"
  else
    echo "k8s-validate: FAIL: overlay $name"
    status=1
  fi
done
# The README's kubectl commands against what the overlays and collect/
# render; and a README with wrong ones must fail.
renders=("$work"/cpu-small.yaml "$work"/gpu.yaml "$work"/elastic.yaml "$work"/collect.yaml)
if out=$(python3 "$here/readme.py" "$k8s/README.md" "${renders[@]}" 2>&1); then
  echo "k8s-validate: ok: $out"
else
  echo "k8s-validate: FAIL: tools/k8s/README.md:"
  echo "$out"
  status=1
fi
expect=$(sed -n 's/^# expect: //p' "$here/readme-fixture.md")
if out=$(python3 "$here/readme.py" "$here/readme-fixture.md" "${renders[@]}" 2>&1); then
  echo "k8s-validate: FAIL: validate/readme-fixture.md passed the README check"
  status=1
elif ! grep -qF -- "$expect" <<< "$out"; then
  echo "k8s-validate: FAIL: validate/readme-fixture.md failed, but not with '$expect':"
  echo "$out"
  status=1
else
  echo "k8s-validate: ok: a README with wrong commands is rejected:"
  grep -F -- "$expect" <<< "$out"
fi
for fixture in "$here"/fixtures/*.yaml; do
  name=$(basename "$fixture" .yaml)
  rejected "$name" "$fixture" "$fixture" || status=1
done
for fixture in "$here"/fixtures/*/; do
  [ -d "$fixture" ] || continue
  name=$(basename "$fixture")
  if ! kubectl kustomize "$fixture" > "$work/fixture-$name.yaml" 2> "$work/fixture-$name.err"; then
    echo "k8s-validate: FAIL: broken fixture $name does not render:"
    cat "$work/fixture-$name.err"
    status=1
    continue
  fi
  rejected "$name" "$work/fixture-$name.yaml" "$fixture/kustomization.yaml" || status=1
done
exit $status
