#!/usr/bin/env bash
# Make sure PostgreSQL, Redis and RabbitMQ are up on 127.0.0.1 (they are started before sessions on this machine
# kind; this starts whichever is down). RabbitMQ is the production broker: tests/portal/test_broker_isolation.py
# checks agents' broker users against it (and skips, saying why, where it is not installed).
set -euo pipefail
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
if command -v rabbitmq-server >/dev/null && ! rabbitmq-diagnostics -q check_port_connectivity >/dev/null 2>&1; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached
  for _ in $(seq 60); do rabbitmq-diagnostics -q check_port_connectivity >/dev/null 2>&1 && break; sleep 1; done
fi
if command -v rabbitmq-plugins >/dev/null && ! rabbitmq-plugins -q is_enabled rabbitmq_management >/dev/null 2>&1; then
  echo "enabling RabbitMQ's management API (docker compose makes agents' broker users through it)"
  rabbitmq-plugins -q enable rabbitmq_management >/dev/null
fi
pg_isready -h 127.0.0.1 -p 5432
redis-cli -h 127.0.0.1 -p 6379 ping
if command -v rabbitmq-server >/dev/null; then rabbitmq-diagnostics -q check_port_connectivity && echo "RabbitMQ up"; fi
