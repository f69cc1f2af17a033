-- decide.lua decides every rule of one request at once, all or nothing: if
-- any rule denies, no rule consumes anything. It is algo/eval.go in Lua, step
-- for step and in the same order of floating-point operations; the
-- differential test in package algo holds the two to identical answers.
--
-- KEYS: per rule, in order, its state key; a sliding_window_log rule passes
--       two: the sorted set of its admissions, then the total of their costs.
--       All keys of one rule share a hash tag, so they share a cluster slot.
-- ARGV[1]: the time in Unix microseconds, or "" to read Redis TIME.
--          Production always sends "", so replicas with skewed clocks agree;
--          only tests pin the time.
-- ARGV[2]: a nonce unique to this call across every replica; it makes
--          sliding_window_log members unique within a microsecond.
-- ARGV[3..]: per rule 8 values: algorithm (1 fixed_window,
--          2 sliding_window_log, 3 sliding_window_counter, 4 token_bucket,
--          5 leaky_bucket, 6 gcra), limit, window (us), burst, delay (us),
--          cost, max cost (the largest cost the rule can ever admit),
--          shadow (1: the rule's denial does not deny the request).
-- Reply: {admitted (1 or 0), the time used (us), then per rule 6 integers:
--        allowed (1 or 0), remaining, reset after (us), retry after (us),
--        delay (us), reason (0 none, 1 limited, 2 cost too high)}.
--        The request is admitted when every rule that is not a shadow
--        allows; then every allowing rule consumes and answers with its
--        counts after consuming. Otherwise nothing is consumed and the
--        counts are those that stand.
--
-- State, by algorithm:
--   fixed_window            hash w (window index), n (count)
--   sliding_window_log      sorted set of "<cost>:<nonce>" scored by time,
--                           and a string holding the total cost
--   sliding_window_counter  hash w (current window index), n (its count),
--                           p (the previous window's count)
--   token_bucket            hash x (tokens), t (last update)
--   leaky_bucket            hash x (level), t (last update)
--   gcra                    string: the theoretical arrival time
-- Fractional values are written with %.17g, which gives a double back
-- exactly (tostring keeps 14 digits). Every write sets an expiry: the time
-- until the state reads the same as no state. A denial writes nothing.

local floor, ceil, min, max, fmod = math.floor, math.ceil, math.min, math.max, math.fmod

local pinned = ARGV[1] ~= ''
local now
if pinned then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local nonce = ARGV[2]

local function num(x)
  return string.format('%.17g', x)
end

-- ttl turns microseconds of relevance into a key expiry in milliseconds.
-- A pinned clock runs apart from Redis's own, which expires keys: give tests
-- an hour of slack so a key never expires under a test's feet.
local function ttl(us)
  local ms = max(ceil(us / 1000), 1)
  if pinned then
    ms = ms + 3600000
  end
  return ms
end

local function window_index(w)
  return (now - fmod(now, w)) / w
end

local algorithms = {}

algorithms[1] = function(r) -- fixed_window
  local W, L = r.W, r.L
  local idx, n = window_index(W), 0
  local st = redis.call('HMGET', r.key, 'w', 'n')
  if st[1] then
    local w = tonumber(st[1])
    if w >= idx then
      -- A later window than now's: the clock stepped back.
      idx, n = w, tonumber(st[2])
    end
  end
  local ending = (idx + 1) * W - now
  r.remaining = L - n
  if n > 0 then
    r.reset = ending
  end
  if r.cost > r.cap or n + r.cost > L then
    r.retry = ending
    return
  end
  r.allowed, r.t_remaining, r.t_reset = 1, L - n - r.cost, ending
  r.write = function()
    redis.call('HSET', r.key, 'w', num(idx), 'n', num(n + r.cost))
    redis.call('PEXPIRE', r.key, ttl(ending))
  end
end

local function log_cost(member)
  return tonumber(string.match(member, '^(%d+):'))
end

algorithms[2] = function(r) -- sliding_window_log
  local W, L = r.W, r.L
  local edge = now - W
  local n = 0
  local live = redis.call('ZCARD', r.key)
  local gone = {}
  if live > 0 then
    n = tonumber(redis.call('GET', r.key2) or '0')
    gone = redis.call('ZRANGEBYSCORE', r.key, '-inf', edge)
    for _, m in ipairs(gone) do
      n = n - log_cost(m)
    end
    live = live - #gone
  end
  r.remaining = L - n
  if n > 0 then
    local newest = redis.call('ZRANGE', r.key, -1, -1, 'WITHSCORES')
    r.reset = tonumber(newest[2]) + W - now
  end
  if r.cost > r.cap or n + r.cost > L then
    -- The oldest entries must leave until the request fits.
    local need, freed, offset = n + r.cost - L, 0, 0
    while offset < live do
      local page = redis.call('ZRANGEBYSCORE', r.key, '(' .. num(edge), '+inf', 'WITHSCORES', 'LIMIT', offset, 128)
      if #page == 0 then
        return
      end
      for i = 1, #page, 2 do
        freed = freed + log_cost(page[i])
        if freed >= need then
          r.retry = tonumber(page[i + 1]) + W - now
          return
        end
      end
      offset = offset + #page / 2
    end
    return
  end
  r.allowed, r.t_remaining, r.t_reset = 1, L - n - r.cost, W
  r.write = function()
    if #gone > 0 then
      redis.call('ZREMRANGEBYSCORE', r.key, '-inf', edge)
    end
    redis.call('ZADD', r.key, num(now), num(r.cost) .. ':' .. nonce)
    redis.call('PEXPIRE', r.key, ttl(W))
    redis.call('SET', r.key2, num(n + r.cost), 'PX', ttl(W))
  end
end

algorithms[3] = function(r) -- sliding_window_counter
  local W, L = r.W, r.L
  local idx, cur, prev = window_index(W), 0, 0
  local st = redis.call('HMGET', r.key, 'w', 'n', 'p')
  if st[1] then
    local w = tonumber(st[1])
    if w >= idx then
      idx, cur, prev = w, tonumber(st[2]), tonumber(st[3])
    elseif w == idx - 1 then
      prev = tonumber(st[2])
    end
  end
  local e = max(now - idx * W, 0) -- elapsed in the current window
  local est = prev * (W - e) / W + cur
  r.remaining = max(floor(L - est), 0)
  if cur > 0 then
    r.reset = 2 * W - e
  elseif prev > 0 then
    r.reset = W - e
  end
  if r.cost > r.cap then
    return
  elseif est + r.cost <= L then
    r.allowed, r.t_remaining, r.t_reset = 1, max(floor(L - est - r.cost), 0), 2 * W - e
    r.write = function()
      redis.call('HSET', r.key, 'w', num(idx), 'n', num(cur + r.cost), 'p', num(prev))
      redis.call('PEXPIRE', r.key, ttl(2 * W - e))
    end
  elseif cur + r.cost <= L then
    -- Only the previous window's weight must shrink.
    local at = W - (L - cur - r.cost) * W / prev
    r.retry = max(ceil(at - e), 1)
  else
    -- Wait into the next window, where this window's count is the previous.
    local at = W - (L - r.cost) * W / cur
    r.retry = W - e + max(ceil(at), 0)
  end
end

algorithms[4] = function(r) -- token_bucket
  local W, L, B = r.W, r.L, r.B
  local tokens = B
  local st = redis.call('HMGET', r.key, 'x', 't')
  if st[1] then
    tokens = min(B, tonumber(st[1]) + max(now - tonumber(st[2]), 0) * L / W)
  end
  r.remaining = floor(tokens)
  r.reset = ceil((B - tokens) * W / L)
  if r.cost > r.cap or tokens < r.cost then
    r.retry = ceil((r.cost - tokens) * W / L)
    return
  end
  tokens = tokens - r.cost
  local full = ceil((B - tokens) * W / L)
  r.allowed, r.t_remaining, r.t_reset = 1, floor(tokens), full
  r.write = function()
    redis.call('HSET', r.key, 'x', num(tokens), 't', num(now))
    redis.call('PEXPIRE', r.key, ttl(full))
  end
end

algorithms[5] = function(r) -- leaky_bucket
  local W, L, B = r.W, r.L, r.B
  local level = 0
  local st = redis.call('HMGET', r.key, 'x', 't')
  if st[1] then
    level = max(0, tonumber(st[1]) - max(now - tonumber(st[2]), 0) * L / W)
  end
  r.remaining = max(floor(B - level), 0)
  r.reset = ceil(level * W / L)
  if r.cost > r.cap then
    return
  end
  -- The request waits until enough has drained for it to fit.
  local wait = 0
  local over = level + r.cost - B
  if over > 0 then
    wait = ceil(over * W / L)
  end
  if wait > r.D then
    r.retry = wait - r.D
    return
  end
  level = level + r.cost
  local empty = ceil(level * W / L)
  r.allowed, r.t_remaining, r.t_reset, r.t_delay = 1, max(floor(B - level), 0), empty, wait
  r.write = function()
    redis.call('HSET', r.key, 'x', num(level), 't', num(now))
    redis.call('PEXPIRE', r.key, ttl(empty))
  end
end

algorithms[6] = function(r) -- gcra
  local T = r.W / r.L -- emission interval
  local tolerance = T * r.B
  local tat = now
  local v = redis.call('GET', r.key)
  if v then
    tat = max(tonumber(v), now)
  end
  r.remaining = max(floor((tolerance - (tat - now)) / T), 0)
  r.reset = ceil(tat - now)
  if r.cost > r.cap then
    return
  end
  local new = tat + T * r.cost
  local wait = new - tolerance - now
  if wait > 0 then
    r.retry = ceil(wait)
    return
  end
  r.allowed = 1
  r.t_remaining = max(floor((tolerance - (new - now)) / T), 0)
  r.t_reset = ceil(new - now)
  r.write = function()
    redis.call('SET', r.key, num(new), 'PX', ttl(new - now))
  end
end

-- Phase one: every rule decides without writing.
local rules, all, k = {}, 1, 1
for a = 3, #ARGV, 8 do
  local r = {
    algorithm = tonumber(ARGV[a]),
    L = tonumber(ARGV[a + 1]),
    W = tonumber(ARGV[a + 2]),
    B = tonumber(ARGV[a + 3]),
    D = tonumber(ARGV[a + 4]),
    cost = tonumber(ARGV[a + 5]),
    cap = tonumber(ARGV[a + 6]),
    shadow = ARGV[a + 7] == '1',
    key = KEYS[k],
    allowed = 0, remaining = 0, reset = 0, retry = 0, t_delay = 0,
  }
  k = k + 1
  if r.algorithm == 2 then
    r.key2 = KEYS[k]
    k = k + 1
  end
  algorithms[r.algorithm](r)
  if r.allowed == 0 and not r.shadow then
    all = 0
  end
  rules[#rules + 1] = r
end

-- Phase two: only if the request is admitted, write, and answer with the
-- counts after consuming; otherwise answer with the counts as they stand.
local reply = { all, now }
for _, r in ipairs(rules) do
  local remaining, reset, retry, delay, reason = r.remaining, r.reset, r.retry, 0, 0
  if r.allowed == 0 then
    if r.cost > r.cap then
      reason, retry = 2, 0
    else
      reason = 1
    end
  elseif all == 1 then
    r.write()
    remaining, reset, delay = r.t_remaining, r.t_reset, r.t_delay
  end
  reply[#reply + 1] = r.allowed
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
  reply[#reply + 1] = retry
  reply[#reply + 1] = delay
  reply[#reply + 1] = reason
end
return reply
