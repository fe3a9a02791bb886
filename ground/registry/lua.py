"""Lua shared by the scripts that keep expiring entries in Redis hashes (placement's
claims, demand and failure marks; the edges' loads)."""

from __future__ import annotations

# Redis's clock (`now_ms`), and `unexpired(key)`: the entries of a hash whose values are
# "expiry_ms rest" that have not expired, as {field, rest, expiry_ms} each (the expired
# ones are deleted, and so is a value not of that form: another version's, or damaged —
# a script that failed on it would fail on every call). A script is this followed by
# its own body.
UNEXPIRED = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local function unexpired(key)
  local found = {}
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local until_ms, rest = string.match(all[i + 1], '^(%d+) (.*)$')
    if until_ms == nil or tonumber(until_ms) <= now_ms then
      redis.call('HDEL', key, all[i])
    else
      table.insert(found, {all[i], rest, tonumber(until_ms)})
    end
  end
  return found
end
"""

# KEYS: an app's demand (`keys.wake_demand`). ARGV: edge id, demand (0: withdraw), ttl ms.
# -> the sum of every edge's unexpired demand, this one's included: a wake's report
# (placement), and an edge's own thaw asking whether the machine it thawed is enough
# (edge/coldpath.py)
REPORT_DEMAND = UNEXPIRED + """
if tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d ', now_ms + tonumber(ARGV[3])) .. ARGV[2])
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local total = 0
for _, entry in ipairs(unexpired(KEYS[1])) do total = total + (tonumber(entry[2]) or 0) end
return total
"""
