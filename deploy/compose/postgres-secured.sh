#!/usr/bin/env bash
# The database of docker-compose.secured.yml (its entrypoint, in the postgres image, as root until the image's own
# entrypoint drops to `postgres`): TLS with the certificate deploy/compose/secured-material made for `postgres`, and
# from the network only TLS logins with a password (pg_hba.conf beside this file). The role's password is the secret
# database-password (POSTGRES_PASSWORD_FILE), set when the volume is first initialised.
set -euo pipefail

# PostgreSQL refuses a key that others may read, and a compose secret keeps the host file's owner and mode: a copy.
TLS=/var/lib/postgresql/tls
install -d -o postgres -g postgres -m 700 "$TLS"
install -o postgres -g postgres -m 600 /run/secrets/postgres.key "$TLS/server.key"
install -o postgres -g postgres -m 644 /run/secrets/postgres.pem "$TLS/server.pem"

exec docker-entrypoint.sh postgres -c ssl=on -c "ssl_cert_file=$TLS/server.pem" -c "ssl_key_file=$TLS/server.key" \
    -c hba_file=/etc/order-service/pg_hba.conf
