# Throwaway TLS material and credentials for the local stack's secure listeners.
# Sourced by scripts/kafka and scripts/redis (after common.sh), never run.
#
# ensure_secure_material creates, once per $TAILGUARD_RUN, in $TAILGUARD_SECURE_DIR:
#   ca.pem / ca.key            a throwaway CA (30 days; remade when it ends within a day),
#                              trusted by nothing else
#   server.pem / server.key    the broker's and Redis's certificate (SAN 127.0.0.1, localhost)
#   server.p12                 the same as a PKCS12 keystore for Kafka (password: keystore.password)
#   client.pem / client.key    a client certificate signed by the CA (for mTLS tests)
#   kafka.password             the SCRAM password of Kafka user "tailguard"
#   redis.password             the password of Redis ACL user "tailguard"
# Nothing of this is committed: it lives and dies with the run directory.

TAILGUARD_SECURE_DIR="$TAILGUARD_RUN/secure"
SECURE_USER=tailguard

_random_secret() { openssl rand -hex 24; }

ensure_secure_material() {
  local d="$TAILGUARD_SECURE_DIR"
  command -v openssl >/dev/null || apt_install openssl
  if [ -f "$d/.complete" ] && openssl x509 -checkend 86400 -noout -in "$d/server.pem" >/dev/null 2>&1; then
    return 0
  fi
  rm -rf "$d"; mkdir -p "$d"; chmod 700 "$d"
  say "generating a throwaway CA, server and client certificates in $d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=tailguard throwaway test CA" \
      -keyout ca.key -out ca.pem \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
      -extfile server.ext -out server.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=tailguard-client" -keyout client.key -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
      -extfile client.ext -out client.pem 2>/dev/null
    _random_secret >keystore.password
    openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name kafka \
      -passout "file:keystore.password" -out server.p12
    _random_secret >kafka.password
    _random_secret >redis.password
    rm -f ./*.csr ./*.ext ./*.srl
    chmod 600 ./*
  ) || die "generating the test certificates failed (openssl)"
  touch "$d/.complete"
}
