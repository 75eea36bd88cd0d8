"""Lua scripts of the Redis directory: each change is one atomic script.

Every script first reads the namespace's generation, lifted to the caller's
floor (the highest generation that client has seen), so a restarted, empty
server can never hand out a lower generation than before. Entries are msgpack
arrays [tier, node, location, codec, size_bucket, generation]; index 6 is the
generation. Errors start with AKV_<KIND> and map to the directory's exceptions.
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

# KEYS: meta, entry, ref, genset(new gen), gens
# ARGV: gen, packed, hexkey, floor, genset prefix, initial refcount, restore(0|1)
PUT = (
    PRELUDE
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
  if restore and og >= gen then return cur end
  if og ~= gen then redis.call('SREM', ARGV[5] .. og, ARGV[3]) end
  if restore then redis.call('SET', KEYS[3], 0) end
else
  redis.call('SET', KEYS[3], ARGV[6])
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[3])
redis.call('SADD', KEYS[5], gen)
return cur
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

# KEYS: entry, ref   ARGV: hexkey, genset prefix
DELETE = """
local e = redis.call('GET', KEYS[1])
if not e then return 0 end
local r = tonumber(redis.call('GET', KEYS[2]) or '0')
if r > 0 then return redis.error_reply('AKV_IN_USE ' .. r .. ' references remain') end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', ARGV[2] .. cmsgpack.unpack(e)[6], ARGV[1])
return 1
"""

# KEYS: meta   ARGV: floor
OPEN = (
    PRELUDE
    + """
local cur = cur_gen(KEYS[1], tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'gen', cur + 1, 'sealed', 0)
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

# KEYS: meta   ARGV: generation, floor
ADVANCE = (
    PRELUDE
    + """
local cur = cur_gen(KEYS[1], tonumber(ARGV[2]))
local gen = tonumber(ARGV[1])
if gen < cur then
  return redis.error_reply('AKV_REGRESSION at generation ' .. cur .. '; refusing ' .. gen)
end
if gen > cur then redis.call('HSET', KEYS[1], 'gen', gen, 'sealed', 0) end
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
