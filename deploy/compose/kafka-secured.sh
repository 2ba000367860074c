#!/usr/bin/env bash
# The broker of docker-compose.secured.yml (its entrypoint, in the apache/kafka image): Apache Kafka in KRaft mode that
# takes only authenticated, encrypted clients, with the authorizer on and automatic topic creation off, as managed
# Kafka does (contract §11). Listeners, all TLS with the broker's certificate for `kafka`
# (deploy/compose/secured-material):
#
#   CLIENTS     9094  SASL_SSL, SCRAM-SHA-512: admin (a super user: topics apply, the ACLs) and order-service (the
#                     service: only the ACLs kafka-acls.sh grants it)
#   INTERNAL    9095  SSL with the broker's own client certificate (CN=broker is User:broker, a super user)
#   CONTROLLER  9093  the same
#
# The SCRAM users are written when the storage is first formatted, from the passwords mounted as secrets: a password
# made afresh needs a fresh volume (`down -v`). The configuration holds the key store's password: it is written at
# each start under /tmp, mode 600. (The paths may be moved by the KAFKA_SECURED_* variables, to run it elsewhere.)
set -euo pipefail

SECRETS=${KAFKA_SECURED_SECRETS:-/run/secrets}
CONFIG=${KAFKA_SECURED_CONFIG:-/tmp/kafka-secured}
DATA=${KAFKA_SECURED_DATA:-/var/lib/kafka/data}
BIN=${KAFKA_SECURED_BIN:-/opt/kafka/bin}
HOST=${KAFKA_SECURED_HOST:-kafka}
ADMIN=admin
SERVICE=order-service

umask 077
mkdir -p "$CONFIG"
cat >"$CONFIG/server.properties" <<PROPERTIES
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:9093
listeners=CLIENTS://:9094,INTERNAL://:9095,CONTROLLER://:9093
advertised.listeners=CLIENTS://$HOST:9094,INTERNAL://$HOST:9095
listener.security.protocol.map=CLIENTS:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL
inter.broker.listener.name=INTERNAL
controller.listener.names=CONTROLLER

ssl.keystore.type=PKCS12
ssl.keystore.location=$SECRETS/kafka-broker.p12
ssl.keystore.password=$(<"$SECRETS/kafka-broker-keystore-password")
ssl.truststore.type=PEM
ssl.truststore.location=$SECRETS/ca.pem
ssl.endpoint.identification.algorithm=https
listener.name.internal.ssl.client.auth=required
listener.name.controller.ssl.client.auth=required
# The broker's certificate, CN=broker,O=order-service compose, is User:broker.
ssl.principal.mapping.rules=RULE:^CN=([^,]+),O=order-service compose\$/\$1/,DEFAULT

listener.name.clients.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.clients.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;

authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:broker;User:$ADMIN
auto.create.topics.enable=false

log.dirs=$DATA
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPERTIES

# The admin's client configuration, for the healthcheck.
cat >"$CONFIG/admin.properties" <<PROPERTIES
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$ADMIN" password="$(<"$SECRETS/kafka-admin-password")";
ssl.truststore.type=PEM
ssl.truststore.location=$SECRETS/ca.pem
PROPERTIES

if [[ ! -f $DATA/meta.properties ]]; then
    echo "kafka-secured: formatting $DATA with the SCRAM users $ADMIN and $SERVICE" >&2
    "$BIN/kafka-storage.sh" format --config "$CONFIG/server.properties" \
        --cluster-id "$("$BIN/kafka-storage.sh" random-uuid)" \
        --add-scram "SCRAM-SHA-512=[name=$ADMIN,password=$(<"$SECRETS/kafka-admin-password")]" \
        --add-scram "SCRAM-SHA-512=[name=$SERVICE,password=$(<"$SECRETS/kafka-service-password")]" >/dev/null
fi
exec "$BIN/kafka-server-start.sh" "$CONFIG/server.properties"
