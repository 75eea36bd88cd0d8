{{/* The external Redis URL sits in a Secret the chart cannot read at render time, so the
     head pod checks it against redis.external before `agentkv serve` uses it: a URL that
     disagrees with the values (plaintext where TLS is declared, certificate or host name
     verification turned off, a CA other than the one mounted) stops the pod in this init
     container, whose log names the value to fix. It never prints the URL (it holds the
     password). Runs where redis.mode is external. */}}
{{- define "agentkv.redisUrlCheckScript" -}}
{{- $ext := .Values.redis.external -}}
set -eu
fail() {
  echo "redis.external: the URL in Secret {{ $ext.urlSecret.name }} (key {{ $ext.urlSecret.key }}) $1" >&2
  exit 1
}
lower=$(printf '%s' "$AGENTKV_DIRECTORY_REDIS_URL" | tr 'A-Z' 'a-z')
# True when the URL's query has this option=value (compared in lower case).
has() {
  case "$lower" in *[?\&]"$1"|*[?\&]"$1"\&*) return 0 ;; esac
  return 1
}
{{- if $ext.tls.enabled }}
case "$lower" in
  rediss://*) ;;
  *) fail "is not a rediss:// URL, but redis.external.tls.enabled is true: use rediss://, or set redis.external.tls.enabled: false for a plaintext Redis" ;;
esac
if has ssl_cert_reqs=none || has ssl_cert_reqs=optional; then
  fail "turns certificate verification off (ssl_cert_reqs); remove that option"
fi
for v in 0 f false n no; do
  if has "ssl_check_hostname=$v"; then
    fail "turns host name verification off (ssl_check_hostname); remove that option"
  fi
done
{{- with $ext.caSecret.name }}
if ! has "ssl_ca_certs=/etc/agentkv/redis-ca/{{ lower $ext.caSecret.key }}"; then
  fail "does not verify against the CA of redis.external.caSecret ({{ . }}): add ?ssl_ca_certs=/etc/agentkv/redis-ca/{{ $ext.caSecret.key }} to it"
fi
{{- end }}
{{- else }}
case "$lower" in
  redis://*|unix://*) ;;
  *) fail "is not a redis:// or unix:// URL, but redis.external.tls.enabled is false: set it true (with redis.external.caSecret.name or redis.external.tls.systemCAs) for rediss://" ;;
esac
{{- end }}
{{- end -}}
