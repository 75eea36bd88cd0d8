"""Lua scripts of the Redis directory: each change is one atomic script.

Every script first reads the namespace's generation, lifted to the caller's
floor (the highest generation that client has seen), so a restarted, empty
server can never hand out a lower generation than before. Entries are msgpack
arrays [tier, node, location, codec, size_bucket, generation]; index 6 is the
generation. Errors start with AKV_<KIND> and map to the directory's exceptions.

Each entry written also counts one write of its node in the namespace (``w:<node>``),
in the same script, so a server that lost entries (restarted from an older snapshot)
shows it in that counter too. A generation leaves the ``gens`` set in the script that
takes its last entry out or, if it was the current one then, in the script that opens
(or advances to) a newer one: ``gens`` holds the generations with entries, at most one
more.
"""

PRELUDE = """
local function cur_gen(meta, floor)
  local g = tonumber(redis.call('HGET', meta, 'gen') or '0')
  if g < floor then
    redis.call('HSET', meta, 'gen', floor, 'sealed', 0)
    return floor, 0
  end
  return g, tonumber(redis.call('HGET', meta, 'sealed') or '0')
end
local function is_sealed(gen, cur, sealed)
  return gen < cur or (gen == cur and sealed == 1)
end
"""

# A generation with no entry left leaves ``gens`` (never the current one: it takes entries).
DROP_EMPTY = """
local function drop_if_empty(meta, gens, genset_prefix, gen)
  if redis.call('SCARD', genset_prefix .. gen) == 0
     and tonumber(gen) ~= tonumber(redis.call('HGET', meta, 'gen') or '0') then
    redis.call('SREM', gens, gen)
  end
end
"""

# KEYS: meta, entry, ref, genset(new gen), gens, writes of the entry's node
# ARGV: gen, packed, hexkey, floor, genset prefix, initial refcount, restore(0|1)
# -> {current generation, the node's write count in the namespace after this write}
PUT = (
    PRELUDE
    + DROP_EMPTY
    + """
local cur, sealed = cur_gen(KEYS[1], tonumber(ARGV[4]))
local gen = tonumber(ARGV[1])
if gen > cur then
  return redis.error_reply('AKV_UNKNOWN_GEN generation ' .. gen .. ' not opened (current ' .. cur .. ')')
end
local restore = ARGV[7] == '1'
if (not restore) and is_sealed(gen, cur, sealed) then
  return redis.error_reply('AKV_READONLY generation ' .. gen .. ' is sealed (current ' .. cur .. ')')
end
local old = redis.call('GET', KEYS[2])
if old then
  local og = cmsgpack.unpack(old)[6]
  if restore and og >= gen then return {cur, redis.call('INCR', KEYS[6])} end
  if og ~= gen then
    redis.call('SREM', ARGV[5] .. og, ARGV[3])
    drop_if_empty(KEYS[1], KEYS[5], ARGV[5], og)
  end
  if restore then redis.call('SET', KEYS[3], 0) end
else
  redis.call('SET', KEYS[3], ARGV[6])
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[3])
redis.call('SADD', KEYS[5], gen)
return {cur, redis.call('INCR', KEYS[6])}
"""
)

# KEYS: meta, entry, ref   ARGV: delta (+1|-1), floor
ADJUST = (
    PRELUDE
    + """
local cur, sealed = cur_gen(KEYS[1], tonumber(ARGV[2]))
local e = redis.call('GET', KEYS[2])
if not e then return redis.error_reply('AKV_MISSING no entry') end
local delta = tonumber(ARGV[1])
local gen = cmsgpack.unpack(e)[6]
if delta > 0 and is_sealed(gen, cur, sealed) then
  return redis.error_reply('AKV_READONLY generation ' .. gen .. ' is sealed (current ' .. cur .. ')')
end
local r = tonumber(redis.call('GET', KEYS[3]) or '0')
if r + delta < 0 then return redis.error_reply('AKV_UNDERFLOW no references') end
return redis.call('INCRBY', KEYS[3], delta)
"""
)

# KEYS: entry, ref, meta, gens   ARGV: hexkey, genset prefix
DELETE = (
    DROP_EMPTY
    + """
local e = redis.call('GET', KEYS[1])
if not e then return 0 end
local r = tonumber(redis.call('GET', KEYS[2]) or '0')
if r > 0 then return redis.error_reply('AKV_IN_USE ' .. r .. ' references remain') end
redis.call('DEL', KEYS[1], KEYS[2])
local gen = cmsgpack.unpack(e)[6]
redis.call('SREM', ARGV[2] .. gen, ARGV[1])
drop_if_empty(KEYS[3], KEYS[4], ARGV[2], gen)
return 1
"""
)

# KEYS: meta, gens   ARGV: generation, genset prefix   (an older server's leftovers)
PRUNE = DROP_EMPTY + """
drop_if_empty(KEYS[1], KEYS[2], ARGV[2], ARGV[1])
return 0
"""

# KEYS: meta, gens   ARGV: floor, genset prefix
OPEN = (
    PRELUDE
    + DROP_EMPTY
    + """
local cur = cur_gen(KEYS[1], tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'gen', cur + 1, 'sealed', 0)
drop_if_empty(KEYS[1], KEYS[2], ARGV[2], cur)
return cur + 1
"""
)

# KEYS: meta   ARGV: generation, floor
SEAL = (
    PRELUDE
    + """
local cur = cur_gen(KEYS[1], tonumber(ARGV[2]))
local gen = tonumber(ARGV[1])
if gen > cur or gen < 1 then
  return redis.error_reply('AKV_UNKNOWN_GEN generation ' .. gen .. ' not opened (current ' .. cur .. ')')
end
if gen == cur then redis.call('HSET', KEYS[1], 'sealed', 1) end
return cur
"""
)

# KEYS: meta, gens   ARGV: generation, floor, genset prefix
ADVANCE = (
    PRELUDE
    + DROP_EMPTY
    + """
local cur = cur_gen(KEYS[1], tonumber(ARGV[2]))
local gen = tonumber(ARGV[1])
if gen < cur then
  return redis.error_reply('AKV_REGRESSION at generation ' .. cur .. '; refusing ' .. gen)
end
if gen > cur then
  redis.call('HSET', KEYS[1], 'gen', gen, 'sealed', 0)
  drop_if_empty(KEYS[1], KEYS[2], ARGV[3], cur)
end
return gen
"""
)

# KEYS: meta   ARGV: floor  -> {generation, sealed}
STATE = (
    PRELUDE
    + """
local cur, sealed = cur_gen(KEYS[1], tonumber(ARGV[1]))
return {cur, sealed}
"""
)

# KEYS: tombstones (sorted set)   ARGV: namespace, how many tombstones to keep
# Scores are a sequence, never a time: the newest ``keep`` erasures stay.
TOMBSTONE = """
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local seq = (tonumber(top[2] or '0') or 0) + 1
redis.call('ZADD', KEYS[1], seq, ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[2]) + 1))
return seq
"""
