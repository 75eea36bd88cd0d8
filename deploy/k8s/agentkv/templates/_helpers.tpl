{{/* Names ---------------------------------------------------------------------- */}}
{{- define "agentkv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The RayCluster is named after the release too, so keep room for KubeRay's
     "-head-svc" and worker-pod suffixes ("-hbm-gpu-worker-xxxxx"), the chart's own
     ("-dashboard" at most) and a StatefulSet's pod and revision-hash suffixes within the
     63-character DNS label limit: a full name over 40 characters keeps its first
     31, then "-" and 8 hex digits of the SHA-256 of the whole name, so two long release
     names that share a prefix still name different objects. Names of 40 or fewer stay as
     they are (an upgrade keeps them), unless they hold a dot: Helm takes a release name
     such as "my.release", but a Service name is a DNS-1035 label and KubeRay's and the
     StatefulSets' pod names are DNS labels, so dots become "-" and the name ends in the
     hash of the whole name ("my-release-agentkv-<8 hex>"), never the name of a release
     "my-release" in the same namespace. */}}
{{- define "agentkv.fullname" -}}
{{- $full := .Values.fullnameOverride -}}
{{- if not $full -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- $full = ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- end -}}
{{- include "agentkv.boundedName" (dict "name" $full "max" 40) -}}
{{- end -}}

{{/* A DNS label of at most .max characters (40 or fewer, 63 the DNS label limit): a
     name without dots that fits is kept whole (trailing "-" trimmed); any other has its
     dots replaced by "-" and is cut to leave room for "-<8 hex of the SHA-256 of the whole
     name as given>". Argument: dict "name" "max". */}}
{{- define "agentkv.boundedName" -}}
{{- $name := toString .name -}}
{{- $max := int .max -}}
{{- if and (le (len $name) $max) (not (contains "." $name)) -}}
{{- regexReplaceAll "-+$" $name "" -}}
{{- else -}}
{{- printf "%s-%s" (regexReplaceAll "-+$" (trunc (sub $max 9 | int) (replace "." "-" $name)) "") (sha256sum $name | trunc 8) -}}
{{- end -}}
{{- end -}}

{{- define "agentkv.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentkv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentkv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentkv.labels" -}}
helm.sh/chart: {{ include "agentkv.chart" . }}
{{ include "agentkv.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentkv
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of every pod that is a Ray node: they talk to each other on any port and
     host the controller or pool actors, which open the Redis directory. */}}
{{- define "agentkv.rayMemberLabels" -}}
agentkv.io/ray-member: "true"
agentkv.io/directory-client: "true"
{{- end -}}

{{- define "agentkv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentkv.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "agentkv.image" -}}
{{- include "agentkv.imageRef" (dict "path" "image" "image" .Values.image "defaultTag" .Chart.AppVersion) -}}
{{- end -}}

{{/* An image reference from repository and tag, or a clear failure naming the value: the
     API server takes any string, and a malformed one (a tag in the repository, upper case,
     a digest written as a tag) leaves every pod in InvalidImageName. The tag is a tag
     ("0.1.0"), a digest ("sha256:<64 hex>", pulled as repository@sha256:...) or both
     ("0.1.0@sha256:<64 hex>"). Argument: dict "path" <values path> "image" "defaultTag". */}}
{{- define "agentkv.imageRef" -}}
{{- $repo := toString .image.repository -}}
{{- $tag := toString (default .defaultTag .image.tag) -}}
{{- if not (regexMatch "^([A-Za-z0-9][-A-Za-z0-9.]*(:[0-9]+)?/)?[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*$" $repo) -}}
{{- fail (printf "values: at '/%s/repository': %q is not an image repository (lower-case path components, an optional registry host[:port]/ first, no tag or digest); put the tag or digest in %s.tag" (replace "." "/" .path) $repo .path) -}}
{{- end -}}
{{- $digest := "^sha256:[0-9a-f]{64}$" -}}
{{- if regexMatch $digest $tag -}}
{{- printf "%s@%s" $repo $tag -}}
{{- else if regexMatch "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(@sha256:[0-9a-f]{64})?$" $tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- else -}}
{{- fail (printf "values: at '/%s/tag': %q is neither an image tag (letters, digits, '_', '.', '-', at most 128, not starting with '.' or '-') nor a digest (sha256:<64 lower-case hex>, or <tag>@sha256:<64 hex>); fix %s.tag" (replace "." "/" .path) $tag .path) -}}
{{- end -}}
{{- end -}}

{{/* KubeRay names the head Service <raycluster>-head-svc; the GCS listens on 6379. */}}
{{- define "agentkv.rayHeadAddress" -}}
{{- printf "%s-head-svc.%s.svc.cluster.local:6379" (include "agentkv.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "agentkv.redisHost" -}}
{{- printf "%s-redis.%s.svc.cluster.local" (include "agentkv.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Sizes ---------------------------------------------------------------------- */}}
{{/* Bytes -> a MiB quantity, rounded up. Values arrive as float64, hence int64. */}}
{{- define "agentkv.mib" -}}
{{- printf "%dMi" (div (add (int64 .) 1048575) 1048576) -}}
{{- end -}}

{{/* /dev/shm of one Ray pod: object store + host pool (when it hosts one) + headroom.
     Argument: dict "group" <group values> "root" $. */}}
{{- define "agentkv.shmBytes" -}}
{{- $g := .group -}}
{{- $pool := 0 -}}
{{- if $g.hostPool -}}{{- $pool = int64 .root.Values.pool.hostPoolBytes -}}{{- end -}}
{{- add (int64 $g.objectStoreBytes) $pool (int64 $g.shmHeadroomBytes) -}}
{{- end -}}

{{/* Ray custom resources as the rayStartParams string KubeRay and Ray's autoscaler
     parse: '"{\"akv_pool\": 1}"'. Argument: a dict of name -> int (may be empty). */}}
{{- define "agentkv.rayResources" -}}
{{- $parts := list -}}
{{- range $name, $n := . -}}
{{- $parts = append $parts (printf "\\\"%s\\\": %d" $name (int64 $n)) -}}
{{- end -}}
{{- printf "\"{%s}\"" (join ", " $parts) -}}
{{- end -}}

{{/* Redis ACL: the rules after the key pattern, exactly as security/redis_acl.py
     acl_rules() emits them (tests/integration/deploy checks the two stay equal). */}}
{{- define "agentkv.redisAclRules" -}}
resetchannels -@all +@read +@write +@string +@hash +@list +@set +@sortedset +@transaction +@scripting +ping +hello +auth +echo +reset +quit -@admin -@dangerous -scan -keys -dbsize -info -slowlog -client -monitor -config -debug -object -randomkey -memory -latency -pubsub -select -swapdb -move -migrate -flushdb -flushall -sort -sort_ro -script|flush -script|kill -function -lastsave -role -command -acl
{{- end -}}

{{/* Environment and mounts shared by Ray containers ---------------------------- */}}
{{- define "agentkv.rayAuthEnv" -}}
{{- if eq .Values.ray.auth.mode "token" }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.ray.auth.secretName }}
      key: auth_token
{{- else }}
- name: RAY_AUTH_MODE
  value: disabled
{{- end }}
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
{{- end -}}

{{- define "agentkv.redisCaSecret" -}}
{{- if and (eq .Values.redis.mode "bundled") .Values.redis.bundled.tls.enabled -}}
{{- .Values.redis.bundled.tls.secretName -}}
{{- else if and (eq .Values.redis.mode "external") .Values.redis.external.caSecret.name -}}
{{- .Values.redis.external.caSecret.name -}}
{{- end -}}
{{- end -}}

{{/* Mounts every Ray node needs at the same paths: the service builds pool actor specs
     from its own config and Ray places those actors on any node. */}}
{{- define "agentkv.nodeMounts" -}}
- name: dshm
  mountPath: /dev/shm
- name: tenant-keys
  mountPath: /etc/agentkv/tenant-keys
  {{- if ne .Values.security.tenantKeys.source "ephemeral" }}
  readOnly: true
  {{- end }}
- name: nvme
  mountPath: /var/lib/agentkv/nvme
- name: tmp
  mountPath: /tmp
{{- if include "agentkv.redisCaSecret" . }}
- name: redis-ca
  mountPath: /etc/agentkv/redis-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* Volumes behind agentkv.nodeMounts, except nvme (per pod kind).
     Argument: dict "shmBytes" <int> "root" $. */}}
{{- define "agentkv.nodeVolumes" -}}
{{- $root := .root -}}
{{- $keys := $root.Values.security.tenantKeys -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ include "agentkv.mib" .shmBytes }}
- name: tmp
  emptyDir: {}
- name: tenant-keys
{{- if eq $keys.source "secrets" }}
  projected:
    defaultMode: 0440
    sources:
    {{- range $keys.secretNames }}
      # optional: a Secret that is deleted (a team's tenants erased) leaves running pods
      # without its keys instead of keeping new pods from starting.
      - secret:
          name: {{ . }}
          optional: true
    {{- end }}
{{- else if eq $keys.source "csi" }}
  csi:
    driver: {{ $keys.csi.driver }}
    readOnly: true
    volumeAttributes:
      secretProviderClass: {{ $keys.csi.secretProviderClass }}
{{- else }}
  emptyDir:
    sizeLimit: 16Mi
{{- end }}
{{- with include "agentkv.redisCaSecret" $root }}
- name: redis-ca
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    {{- if eq $root.Values.redis.mode "external" }}
    items:
      - key: {{ $root.Values.redis.external.caSecret.key }}
        path: {{ $root.Values.redis.external.caSecret.key }}
    {{- else }}
    items:
      - key: ca.crt
        path: ca.crt
    {{- end }}
{{- end }}
{{- end -}}

{{/* Argument: dict "root" $ "caps" <capabilities to add, may be empty>. */}}
{{- define "agentkv.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: {{ .root.Values.containerSecurity.readOnlyRootFilesystem }}
capabilities:
  drop: [ALL]
  {{- with .caps }}
  add: {{ toJson . }}
  {{- end }}
{{- end -}}

{{/* Pod-spec knobs of one workload (priority class, topology spread). Argument: its values. */}}
{{- define "agentkv.podKnobs" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A Kubernetes quantity ("24Gi", "17.5Gi", "500m", 2) as a float in base units (bytes,
     cores); 0 when unset. Every suffix values.schema.json accepts is known here. */}}
{{- define "agentkv.quantity" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- /* A plain number (Helm reads `memory: 30000000000` as a float64, which prints as
"3e+10"): its value as it stands. */ -}}
{{- float64 . -}}
{{- else -}}
{{- $q := toString (default "0" .) -}}
{{- $units := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $num := regexFind "^[0-9]+([.][0-9]+)?" $q -}}
{{- $unit := trimPrefix $num $q -}}
{{- if not (hasKey $units $unit) -}}
{{- fail (printf "values: %q is not a Kubernetes quantity the chart knows (a number with one of the suffixes m, k, Ki, M, Mi, G, Gi, T, Ti, P, Pi, E, Ei)" $q) -}}
{{- end -}}
{{- mulf (float64 $num) (get $units $unit) -}}
{{- end -}}
{{- end -}}

{{/* A quantity as the operator wrote it, for messages: a plain number in full (Helm reads
30000000000 as a float64, which prints as "3e+10"). */}}
{{- define "agentkv.quantityText" -}}
{{- if kindIs "float64" . -}}
{{- if eq (float64 .) (floor .) }}{{ printf "%.0f" . }}{{ else }}{{ . }}{{ end -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Bytes of a Kubernetes quantity ("24Gi", "17.5Gi", 1073741824), rounded up; 0 when unset. */}}
{{- define "agentkv.quantityBytes" -}}
{{- int64 (ceil (float64 (include "agentkv.quantity" .))) -}}
{{- end -}}

{{/* Fail rendering when a container's limit is below its request (the API server would
     refuse every pod of the workload). Argument: dict "name" <values path> "resources". */}}
{{- define "agentkv.checkRequests" -}}
{{- $res := .resources | default dict -}}
{{- $requests := $res.requests | default dict -}}
{{- $limits := $res.limits | default dict -}}
{{- range $kind, $limit := $limits -}}
{{- $request := get $requests $kind -}}
{{- if and $request (lt (float64 (include "agentkv.quantity" $limit)) (float64 (include "agentkv.quantity" $request))) -}}
{{- fail (printf "values: at '/%s/resources/limits/%s': the limit %s is below the request %s; Kubernetes refuses such a pod. Raise the limit or lower %s.resources.requests.%s" $.name $kind (include "agentkv.quantityText" $limit) (include "agentkv.quantityText" $request) (replace "/" "." $.name) $kind) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fail rendering when a pod's /dev/shm (memory-backed, counted against the pod's
     memory) cannot fit its memory limit. Argument: dict "name" "shm" "limit". */}}
{{- define "agentkv.checkShm" -}}
{{- $limit := include "agentkv.quantityBytes" .limit | int64 -}}
{{- if and (gt $limit 0) (gt (int64 .shm) $limit) -}}
{{- fail (printf "values: at '/%s/resources/limits/memory': /dev/shm needs %s (host pool + object store + headroom) but the memory limit is %s; the pod would be OOM-killed once the pool fills. Raise the limit or shrink the pool" .name (include "agentkv.mib" .shm) (include "agentkv.quantityText" .limit)) -}}
{{- end -}}
{{- end -}}

{{/* Fail rendering when a pod hosts a pool (hostPool) whose NVMe shard may grow past the
     pod's NVMe emptyDir: every pool gets the same quota (pool.nvme.bytes, the pool pods'
     PVC size), and the kubelet evicts a pod whose emptyDir outgrows its sizeLimit.
     Argument: dict "name" <values key> "group" <group values> "root" $. */}}
{{- define "agentkv.checkScratch" -}}
{{- $shard := int64 .root.Values.pool.nvme.bytes -}}
{{- $need := int64 (include "agentkv.nvmeVolumeBytes" .root.Values.pool.nvme.bytes) -}}
{{- $scratch := int64 .group.scratchBytes -}}
{{- if and .group.hostPool (gt $need $scratch) -}}
{{- fail (printf "values: at '/%s/scratchBytes': the pool on this pod keeps an NVMe shard of up to pool.nvme.bytes (%d), which with compaction's copies and tombstones needs %d on disk, but its NVMe emptyDir holds %d; the kubelet would evict the pod once the shard outgrows it. Raise %s.scratchBytes to at least %d or lower pool.nvme.bytes" .name $shard $need $scratch .name $need) -}}
{{- end -}}
{{- end -}}

{{/* Disk one NVMe shard of quota pool.nvme.bytes may take: while it compacts, its copies
     pass the quota by up to one segment (256 MiB), and tombstones (one 4 KiB block per
     retired record) are outside the quota too; 1/64 of the quota covers them for records
     of 256 KiB and up. Argument: pool.nvme.bytes. */}}
{{- define "agentkv.nvmeVolumeBytes" -}}
{{- $q := int64 . -}}
{{- add $q 268435456 (div $q 64) -}}
{{- end -}}

{{/* Fail rendering when a workload's extraVolumes, extraVolumeMounts or extraEnv cannot
     work in its pod: a volume named like one of the chart's (or named twice), a mount at a
     path the chart already mounts (or mounted twice), a mount of a volume the pod does not
     have, an env name Kubernetes refuses or one the list sets twice. The API server refuses
     the volume and mount clashes in a StatefulSet at install; in the RayCluster it takes
     them, and KubeRay's pod creation fails afterwards: the cluster never starts. The chart's
     own volumes and mounts are read from the pod as rendered, where each extras list comes
     last, so there is no second list of them to keep in step. Argument: dict "path" <values
     path> "what" <the pod, in words> "group" <its values> "pod" <its rendered spec>
     "containers" <names of the containers the extra mounts go to> "claims" <names of its
     volumeClaimTemplates>. */}}
{{- define "agentkv.checkExtras" -}}
{{- $path := .path -}}
{{- $dotted := replace "/" "." $path -}}
{{- $what := .what -}}
{{- $extraVolumes := .group.extraVolumes | default list -}}
{{- $extraMounts := .group.extraVolumeMounts | default list -}}
{{- $volumes := .pod.volumes | default list -}}
{{- $own := dict -}}
{{- range $i, $vol := $volumes -}}
{{- if lt $i (sub (len $volumes) (len $extraVolumes)) }}{{ $_ := set $own (toString $vol.name) true }}{{ end -}}
{{- end -}}
{{- range .claims }}{{ $_ := set $own . true }}{{ end -}}
{{- $ownList := keys $own | sortAlpha | join ", " -}}
{{- $names := dict -}}
{{- range $i, $vol := $extraVolumes -}}
{{- $name := toString (default "" $vol.name) -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" $name) -}}
{{- fail (printf "values: at '/%s/extraVolumes/%d/name': %q is not a volume name Kubernetes takes (a DNS label: at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit); fix %s.extraVolumes[%d].name" $path $i $name $dotted $i) -}}
{{- end -}}
{{- if hasKey $own $name -}}
{{- fail (printf "values: at '/%s/extraVolumes/%d/name': the %s already has a volume named %s, one of the chart's own (%s), and a pod cannot name two volumes alike (Kubernetes refuses the pod; for the head and GPU workers only once KubeRay creates it, after install). Give this volume another name; to mount the chart's %s at another path, name it in %s.extraVolumeMounts instead" $path $i $what $name $ownList $name $dotted) -}}
{{- end -}}
{{- if hasKey $names $name -}}
{{- fail (printf "values: at '/%s/extraVolumes/%d/name': %s.extraVolumes[%s] already names a volume %s, and a pod cannot name two volumes alike; give each its own name" $path $i $dotted (get $names $name) $name) -}}
{{- end -}}
{{- $_ := set $names $name (toString $i) -}}
{{- end -}}
{{- $ownPaths := dict -}}
{{- range $c := .pod.containers -}}
{{- if has $c.name $.containers -}}
{{- $mounts := $c.volumeMounts | default list -}}
{{- range $i, $m := $mounts -}}
{{- if lt $i (sub (len $mounts) (len $extraMounts)) -}}
{{- $_ := set $ownPaths (clean (toString $m.mountPath)) (printf "its volume %s (container %s)" $m.name $c.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $paths := dict -}}
{{- range $i, $m := $extraMounts -}}
{{- $name := toString (default "" $m.name) -}}
{{- $mountPath := toString (default "" $m.mountPath) -}}
{{- if not (or (hasKey $own $name) (hasKey $names $name)) -}}
{{- fail (printf "values: at '/%s/extraVolumeMounts/%d/name': the %s has no volume named %q (the chart's own: %s), and Kubernetes refuses a mount of a volume the pod lacks (for the head and GPU workers only once KubeRay creates the pod, after install); add the volume to %s.extraVolumes or mount one the pod has" $path $i $what $name $ownList $dotted) -}}
{{- end -}}
{{- if not (hasPrefix "/" $mountPath) -}}
{{- fail (printf "values: at '/%s/extraVolumeMounts/%d/mountPath': %q is not an absolute path; set %s.extraVolumeMounts[%d].mountPath to where the container should see the volume" $path $i $mountPath $dotted $i) -}}
{{- end -}}
{{- with get $ownPaths (clean $mountPath) -}}
{{- fail (printf "values: at '/%s/extraVolumeMounts/%d/mountPath': the chart already mounts %s at %s, and a container cannot mount two volumes at one path (Kubernetes refuses the pod; for the head and GPU workers only once KubeRay creates it, after install). Mount it at another path (one below %s is fine)" $path $i . (clean $mountPath) (clean $mountPath)) -}}
{{- end -}}
{{- with get $paths (clean $mountPath) -}}
{{- fail (printf "values: at '/%s/extraVolumeMounts/%d/mountPath': %s.extraVolumeMounts[%s] already mounts a volume at %s, and a container cannot mount two volumes at one path; give each its own path" $path $i $dotted . (clean $mountPath)) -}}
{{- end -}}
{{- $_ := set $paths (clean $mountPath) (toString $i) -}}
{{- end -}}
{{- /* Variables the chart sets itself may be overridden on purpose (a later entry wins);
within the list a second entry of a name is a mistake. */ -}}
{{- $env := dict -}}
{{- range $i, $e := (.group.extraEnv | default list) -}}
{{- $name := toString (default "" $e.name) -}}
{{- if not (regexMatch "^[-._a-zA-Z][-._a-zA-Z0-9]*$" $name) -}}
{{- fail (printf "values: at '/%s/extraEnv/%d/name': %q is not an environment variable name every Kubernetes the chart supports takes (letters, digits, '_', '-' and '.', not starting with a digit), and the API server refuses the pod (for the head and GPU workers only once KubeRay creates it, after install); fix %s.extraEnv[%d].name" $path $i $name $dotted $i) -}}
{{- end -}}
{{- if hasKey $env $name -}}
{{- fail (printf "values: at '/%s/extraEnv/%d/name': %s.extraEnv[%s] already sets %s, and the container would get only the later value; keep one of them" $path $i $dotted (get $env $name) $name) -}}
{{- end -}}
{{- $_ := set $env $name (toString $i) -}}
{{- end -}}
{{- end -}}
