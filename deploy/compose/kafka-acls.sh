#!/usr/bin/env bash
# The one-shot `kafka-acls` service of docker-compose.secured.yml (in the apache/kafka image): grants the service's
# principal, User:order-service, exactly the bindings `order-service topics acls --principal User:order-service
# --kafka-acls` prints for ORDERS_SOURCE_TOPIC=orders and ORDERS_CONSUMER_NAME=order-service, as the admin (contract
# §11, docs/security.md; tests/unit/test_deployment.py checks they agree). Adding a binding that exists changes
# nothing, so every `up` may run it again. (KAFKA_SECURED_* move the paths, to run it elsewhere.)
set -euo pipefail

SECRETS=${KAFKA_SECURED_SECRETS:-/run/secrets}
WORK=${KAFKA_SECURED_CONFIG:-/tmp/kafka-acls}
export PATH=${KAFKA_SECURED_BIN:-/opt/kafka/bin}:$PATH

umask 077
mkdir -p "$WORK"
cd "$WORK"
cat >admin.properties <<PROPERTIES
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(<"$SECRETS/kafka-admin-password")";
ssl.truststore.type=PEM
ssl.truststore.location=$SECRETS/ca.pem
PROPERTIES

kafka-acls.sh --bootstrap-server kafka:9094 --command-config admin.properties --add --allow-principal User:order-service --allow-host '*' --operation Read --operation Write --operation Describe --operation DescribeConfigs --topic orders --resource-pattern-type literal
kafka-acls.sh --bootstrap-server kafka:9094 --command-config admin.properties --add --allow-principal User:order-service --allow-host '*' --operation Read --operation Write --operation Describe --operation DescribeConfigs --topic orders. --resource-pattern-type prefixed
kafka-acls.sh --bootstrap-server kafka:9094 --command-config admin.properties --add --allow-principal User:order-service --allow-host '*' --operation Read --operation Describe --group order-service --resource-pattern-type literal
