-- refund.lua takes back what decide.lua consumed for some rules. A decision
-- whose keys span several Redis Cluster slots runs decide.lua once per slot;
-- when one slot denies after another admitted, the admitting slots are
-- refunded, so the decision consumes nothing, as a single call would.
--
-- KEYS: as decide.lua, for the rules to refund (those it admitted).
-- ARGV[1]: the time decide.lua used (us), from its reply.
-- ARGV[2]: the nonce decide.lua was called with.
-- ARGV[3..]: per rule the 8 values decide.lua was called with.
-- Reply: the number of rules whose state was found and refunded.
--
-- A refund restores the counts, not the expiry: a key may live somewhat
-- longer than its state needs, never shorter.

local fmod, min, max = math.fmod, math.min, math.max
local at = tonumber(ARGV[1])
local nonce = ARGV[2]

local function num(x)
  return string.format('%.17g', x)
end

local function window_index(w)
  return (at - fmod(at, w)) / w
end

local refunded, k = 0, 1
for a = 3, #ARGV, 8 do
  local algorithm = tonumber(ARGV[a])
  local L, W, B = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local cost = tonumber(ARGV[a + 5])
  local key = KEYS[k]
  k = k + 1
  if algorithm == 1 then -- fixed_window
    local st = redis.call('HMGET', key, 'w', 'n')
    if st[1] and tonumber(st[1]) == window_index(W) then
      redis.call('HSET', key, 'n', num(max(tonumber(st[2]) - cost, 0)))
      refunded = refunded + 1
    end
  elseif algorithm == 2 then -- sliding_window_log
    local sum = KEYS[k]
    k = k + 1
    if redis.call('ZREM', key, num(cost) .. ':' .. nonce) == 1 then
      local n = tonumber(redis.call('GET', sum) or '0')
      redis.call('SET', sum, num(max(n - cost, 0)), 'KEEPTTL')
      refunded = refunded + 1
    end
  elseif algorithm == 3 then -- sliding_window_counter
    local st = redis.call('HMGET', key, 'w', 'n', 'p')
    if st[1] then
      local w, idx = tonumber(st[1]), window_index(W)
      if w == idx then
        redis.call('HSET', key, 'n', num(max(tonumber(st[2]) - cost, 0)))
        refunded = refunded + 1
      elseif w == idx + 1 then
        redis.call('HSET', key, 'p', num(max(tonumber(st[3]) - cost, 0)))
        refunded = refunded + 1
      end
    end
  elseif algorithm == 4 then -- token_bucket
    local x = redis.call('HGET', key, 'x')
    if x then
      redis.call('HSET', key, 'x', num(min(B, tonumber(x) + cost)))
      refunded = refunded + 1
    end
  elseif algorithm == 5 then -- leaky_bucket
    local x = redis.call('HGET', key, 'x')
    if x then
      redis.call('HSET', key, 'x', num(max(tonumber(x) - cost, 0)))
      refunded = refunded + 1
    end
  elseif algorithm == 6 then -- gcra
    local tat = redis.call('GET', key)
    if tat then
      redis.call('SET', key, num(tonumber(tat) - W / L * cost), 'KEEPTTL')
      refunded = refunded + 1
    end
  end
end
return refunded
