#!/usr/bin/env bash
# Makes a throwaway certificate authority and, signed by it, a certificate
# for the servers and one for the clients (workers and evaluators), for
# running Monsoon with TLS: local runs, tests, a trial cluster. For a real
# deployment, use your own CA.
#
#   tools/make_certs.sh DIR [NAME...]
#
# DIR gets ca.pem (give it to every daemon as --tls_ca), server.pem and
# server.key (the shards' --tls_cert and --tls_key) and client.pem and
# client.key (the workers' and evaluator's). The server certificate holds
# localhost, 127.0.0.1 and every NAME (the host names or IP addresses the
# clients dial, e.g. ps-0.ps ps-1.ps). Keys are readable by their owner
# only. Needs openssl.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME...]   (NAME: a host name or IP the clients dial)" >&2
  exit 2
fi
dir="$1"
shift
days="${MONSOON_CERT_DAYS:-825}"
mkdir -p "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
    san+=",IP:$name"
  else
    san+=",DNS:$name"
  fi
done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" \
  -subj "/CN=Monsoon run CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

sign() {  # sign NAME SUBJECT EXTENSIONS
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$1.key" -out "$dir/$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/$1.pem" -days "$days" \
    -extfile <(printf '%s\n' "$3") 2>/dev/null
  rm -f "$dir/$1.csr"
}
sign server "/CN=Monsoon server" \
  "subjectAltName=$san
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature"
sign client "/CN=Monsoon client" \
  "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
rm -f "$dir/ca.srl"
chmod 644 "$dir/ca.pem" "$dir/server.pem" "$dir/client.pem"
echo "certificates in $dir: ca.pem, server.pem/server.key, client.pem/client.key (server names: $san)"
