"""The Lua scripts ``RedisStore`` runs: each read-compare-write is one atomic step
on the server, so two replicas can never interleave inside it.

Each script's comment states its ``KEYS`` and ``ARGV``.
"""

from __future__ import annotations

# KEYS[1] snapshot hash; ARGV: new version, payload, ttl ms
CAS = """
local current = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if current ~= tonumber(ARGV[1]) - 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS[1] lock or window; ARGV[1] the value it must still hold (owner token, value read)
DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] snapshot hash; ARGV: the v and d fields read ('' when absent). A valid
# snapshot written since the read changed them, and survives.
DISCARD_SNAPSHOT = """
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return 0
end
local v = redis.call('HGET', KEYS[1], 'v') or ''
local d = redis.call('HGET', KEYS[1], 'd') or ''
if v == ARGV[1] and d == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1]; ARGV[1] the Redis type the key must hold. Our own writes always
# create that type, so anything else is foreign and safe to remove.
DISCARD_WRONG_TYPE = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and kind ~= ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] a session's archive (a list, oldest first); ARGV: the session's byte bound, ttl
# ms, then the new entries. Appends them, then drops the oldest while the list holds
# more bytes than the bound. Returns {bytes kept, bytes dropped}.
ARCHIVE = """
for i = 3, #ARGV do
  redis.call('RPUSH', KEYS[1], ARGV[i])
end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local total = 0
for i = 1, #items do
  total = total + #items[i]
end
local cap = tonumber(ARGV[1])
local first, dropped = 1, 0
while total > cap and first <= #items do
  total = total - #items[first]
  dropped = dropped + #items[first]
  first = first + 1
end
if first > #items then
  redis.call('DEL', KEYS[1])
  return {0, dropped}
end
if first > 1 then
  redis.call('LTRIM', KEYS[1], first - 1, -1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {total, dropped}
"""
