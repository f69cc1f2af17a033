#!lua
-- decide.lua decides a batch of requests in one call. Each request is
-- decided all or nothing, in order: if any of its rules denies, none of its
-- rules consumes anything, and a later request of the batch sees what an
-- earlier one consumed. It is algo/eval.go and algo/log.go in Lua, step for
-- step and in the same order of floating-point operations; the differential
-- test in package algo holds the two to identical answers.
--
-- KEYS: none with a standalone or Sentinel client (the keys are in ARGV[1]);
--       in Redis Cluster, every key of the batch, all of one hash slot, so
--       the cluster routes the call and checks the slot. The script reads
--       its keys from ARGV[1] either way.
-- ARGV[1]: the batch, little-endian binary (struct formats in brackets):
--   header   [d] the time in µs since 2020-01-01T00:00:00Z, or -1 to read
--                Redis TIME (production always reads TIME, so replicas with
--                skewed clocks agree; only tests pin the time)
--            [H] the number of requests, [H] the number of policies,
--            [B] flags: 1 = reply with a refund token per rule
--   policies per policy the batch's rules use, each once: [B] algorithm
--            (1 fixed_window, 2 sliding_window_log,
--            3 sliding_window_counter, 4 token_bucket, 5 leaky_bucket,
--            6 gcra), [d] limit, [d] window (µs), [d] burst, [d] delay
--            (µs), [d] max cost (the largest cost the policy ever admits)
--   requests per request: [B] the number of rules, [d] the request's id
--            (unique to the caller, below 2^52), then per rule: [H] its
--            policy's place in the policies above (0 for the first),
--            [B] shadow (1: its denial does not deny), [d] cost, [H] key
--            length and the key
-- Reply: one string, little-endian binary: per request, [B] admitted
--   (1 or 0), then per rule [B] allowed (1 or 0), [B] reason (0 none,
--   1 limited, 2 cost too high), [d] remaining, [d] reset after (µs),
--   [d] retry after (µs), [d] delay (µs), and with flag 1 [d] a refund
--   token for refund.lua: the window index written (fixed_window,
--   sliding_window_counter), the entry's time (sliding_window_log), 0 for
--   the others. Every value is a whole number; Go reads it as C casts a Lua
--   number to a Redis integer (towards zero). One string, packed here, costs
--   Redis a third of what an array of integers does to convert. An
--   admitted request's allowing rules answer with their counts after
--   consuming; otherwise every rule answers with the counts that stand.
--
-- State, by algorithm, each in one key that expires when its state no longer
-- matters (a bucket's: a full refill or drain after its last write; hex integers are written with %x, which keeps the keys redis
-- holds most of small):
--   fixed_window            string "<window index>:<count>" in hex
--   sliding_window_counter  string "<window index>:<count>:<previous count>"
--   token_bucket            string [dd]: last update (µs), tokens
--   leaky_bucket, gcra      string [dd]: last update (µs), level
--   sliding_window_log      sorted set: per admission, scored by its time, a
--                           member that is the running total of costs up to
--                           and including it (14 hex digits, so that members
--                           of one time sort in order), ':' and the
--                           request's id in hex (so a refund finds it), and
--                           a first member "00000000000000" scored -inf. The entry at or
--                           before the window's edge with the greatest time
--                           is always kept, so the window holds the newest
--                           total minus that entry's total, found in
--                           O(log n) however long the log.
-- Every value is computed and checked before the first write, so a call
-- never fails halfway; a key of the wrong type reads as no state and is
-- replaced; a key that cannot be read (an ACL that denies it) fails the
-- call before anything is written.
--
-- Cost: Redis runs the script for every batch, so it is written for the
-- instructions Redis executes (measured with callgrind on redis-server): a
-- call into C (math.floor, string.sub, ...) costs several times the
-- arithmetic around it, and a table that grows by assignment is rehashed
-- at every power of two. So tables are built by constructors at their
-- size, the hot paths do their arithmetic inline, and a key written again
-- in the same window keeps its expiry (SET ... KEEPTTL) rather than set it
-- again (PX), which costs Redis twice as much.

local sunpack, spack = struct.unpack, struct.pack
local sub, format, find, match, rep = string.sub, string.format, string.find, string.match, string.rep
local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local concat = table.concat
local call, pcall = redis.call, redis.pcall

local EPOCH = 1577836800000000 -- 2020-01-01T00:00:00Z in Unix µs
local REBASE = 4503599627370496 -- 2^52: a log's totals restart below this
local SWEEP = 64 -- left-behind log entries removed per admission, at most
local RETRY_STEPS = 4

local blob = ARGV[1]
local now, nreq, npol, flags, pos = sunpack('<dHHB', blob)
local slack = 0
if now < 0 then
  local t = call('TIME')
  -- Arithmetic converts the strings as tonumber does, without its call.
  now = t[1] * 1000000 + t[2] - EPOCH
  if now < 0 then
    now = 0
  end
else
  -- A pinned clock runs apart from Redis's own, which expires keys: give
  -- tests an hour of slack so a key never expires under a test's feet.
  slack = 3600000
end
local tokens_wanted = flags % 2 == 1
-- The reply formats of a request's first rule (with its admitted byte) and
-- of the others, with or without refund tokens.
local FIRST, NEXT = '<BBBdddd', '<BBdddd'
if tokens_wanted then
  FIRST, NEXT = '<BBBddddd', '<BBddddd'
end

-- Policies, 6 values each from V[6 * place + 1], in one table built by its
-- constructor from one unpack: a table per policy, or a table that grows by
-- assignment (rehashed at every power of two), costs Redis more than the
-- rest of a decision.
local V
if npol == 1 then
  V = { sunpack('<Bddddd', blob, pos) }
  pos = V[7]
elseif npol <= 32 then
  V = { sunpack('<' .. rep('Bddddd', npol), blob, pos) }
  pos = V[6 * npol + 1]
else
  -- More values than one call should push at once: a policy at a time.
  V = {}
  for j = 0, 6 * (npol - 1), 6 do
    V[j + 1], V[j + 2], V[j + 3], V[j + 4], V[j + 5], V[j + 6], pos = sunpack('<Bddddd', blob, pos)
  end
end

-- R holds one request's rules, 17 values each from R[17 * (i - 1) + 1]:
-- what the rule answers, and what it writes if the request is admitted
-- (WTTL 0: keep the key's expiry). MAXCOST is the largest cost the policy
-- ever admits. Sized for one rule; more rules grow it once per call.
local KEY, ALG, COST, MAXCOST, OK, HREM, HRESET, HRETRY, TREM, TRESET, TDELAY, WVAL, WTTL, TOKEN, LAT, LRANK, LTOTAL =
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17
local R = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

-- hexes reads "a:b" or "a:b:c" (c = 0 for the first); nil if v is not one.
-- It is the only function every call makes: every closure costs Redis an
-- allocation and its collection, so the rest is written inline, and the
-- few helpers that buckets and denials need are made only when one does.
-- v is what redis.pcall answered: a string, false (no key) or an error
-- (a table with err); a string's err is nil, read with no call into C.
local function hexes(v)
  if not v then
    return nil
  end
  local e = v.err
  if e then
    if not find(e, 'WRONGTYPE', 1, true) then
      error(v) -- not a wrong type: the key cannot be read (an ACL, say)
    end
    return nil
  end
  local a, b, c = match(v, '^(%x+):(%x+):?(%x*)$')
  if not a then
    return nil
  end
  if c == '' then
    return tonumber(a, 16), tonumber(b, 16), 0
  end
  return tonumber(a, 16), tonumber(b, 16), tonumber(c, 16)
end

-- up and level_at are made by the first bucket rule of a call, the windows'
-- paths doing the same inline: see the bucket branch below.
local up, level_at

-- The reply's strings, one per rule, sized for one.
local reply, r = { '' }, 0
for _ = 1, nreq do
  local nrules, rid
  nrules, rid, pos = sunpack('<Bd', blob, pos)
  local all = 1
  -- Phase one: every rule decides without writing. A key expires (ttl, in
  -- ms) when its state no longer matters; a pinned clock adds slack.
  for i = 1, nrules do
    local b = 17 * (i - 1)
    local id, sh, c, k
    id, sh, c, k, pos = sunpack('<HBdHc0', blob, pos)
    local v = 6 * id
    local a, L, W, B, D, M = V[v + 1], V[v + 2], V[v + 3], V[v + 4], V[v + 5], V[v + 6]
    R[b + KEY], R[b + COST], R[b + ALG], R[b + MAXCOST] = k, c, a, M
    R[b + OK], R[b + HREM], R[b + HRESET], R[b + HRETRY], R[b + TDELAY], R[b + TOKEN] = 0, 0, 0, 0, 0, 0
    if a == 1 then -- fixed_window
      local idx, n, keep = (now - now % W) / W, 0, false
      local w, cnt = hexes(pcall('GET', k))
      if w and w >= idx then
        -- Now's window, or a later one (the clock stepped back): its
        -- key already expires when the window ends.
        idx, n, keep = w, cnt, true
      end
      local ending = (idx + 1) * W - now
      R[b + HREM] = L - n
      if n > 0 then
        R[b + HRESET] = ending
      end
      if c > M or n + c > L then
        R[b + HRETRY] = ending
      else
        R[b + OK], R[b + TREM], R[b + TRESET] = 1, L - n - c, ending
        R[b + WVAL], R[b + TOKEN] = format('%x:%x', idx, n + c), idx
        if keep then
          R[b + WTTL] = 0
        else
          local ttl = ending / 1000
          if ttl % 1 > 0 then
            ttl = ttl - ttl % 1 + 1
          end
          if ttl < 1 then
            ttl = 1
          end
          R[b + WTTL] = ttl + slack
        end
      end
    elseif a == 3 then -- sliding_window_counter
      local w, n, pv = hexes(pcall('GET', k))
      local idx, cur, prev, keep = (now - now % W) / W, 0, 0, false
      if w then
        if w >= idx then
          -- The key already expires a window after this one.
          idx, cur, prev, keep = w, n, pv, true
        elseif w == idx - 1 then
          prev = n
        end
      end
      local e = now - idx * W -- elapsed in the current window
      if e < 0 then
        e = 0
      end
      local est = prev * (W - e) / W + cur
      -- x - x % 1 is floor(x), exactly, without a call into C, which
      -- costs Redis more than the arithmetic.
      local left = L - est
      left = left - left % 1
      if left < 0 then
        left = 0
      end
      R[b + HREM] = left
      if cur > 0 then
        R[b + HRESET] = 2 * W - e
      elseif prev > 0 then
        R[b + HRESET] = W - e
      end
      if c > M then
        -- denied: cost too high
      elseif est + c <= L then
        left = L - est - c
        left = left - left % 1
        if left < 0 then
          left = 0
        end
        R[b + OK], R[b + TREM], R[b + TRESET] = 1, left, 2 * W - e
        R[b + WVAL], R[b + TOKEN] = format('%x:%x:%x', idx, cur + c, prev), idx
        if keep then
          R[b + WTTL] = 0
        else
          local ttl = (2 * W - e) / 1000
          if ttl % 1 > 0 then
            ttl = ttl - ttl % 1 + 1
          end
          if ttl < 1 then
            ttl = 1
          end
          R[b + WTTL] = ttl + slack
        end
      else
        local wait
        if cur + c <= L then
          -- Only the previous window's weight must shrink.
          wait = max(ceil(W - (L - cur - c) * W / prev - e), 1)
        else
          -- Wait into the next window, where this window's count is the
          -- previous.
          wait = W - e + max(ceil(W - (L - c) * W / cur), 0)
        end
        -- Check the wait against the state as it stands.
        local function admits(at)
          local ix, cu, pr = (at - at % W) / W, 0, 0
          if w then
            if w >= ix then
              ix, cu, pr = w, n, pv
            elseif w == ix - 1 then
              pr = n
            end
          end
          local el = max(at - ix * W, 0)
          return pr * (W - el) / W + cu + c <= L
        end
        for _ = 1, RETRY_STEPS do
          if admits(now + wait) then
            break
          end
          wait = wait + 1
        end
        R[b + HRETRY] = wait
      end
    elseif a == 2 then -- sliding_window_log
      local newest = pcall('ZRANGE', k, -1, -1, 'WITHSCORES')
      local total, before, rank, card = 0, 0, -1, 0
      local at = now
      R[b + WVAL] = 'fresh'
      if type(newest) ~= 'table' or newest.err then
        hexes(newest) -- raises if the key cannot be read
        R[b + WVAL] = 'replace' -- a key of another type
      elseif #newest > 0 then
        R[b + WVAL] = 'append'
        total = tonumber(sub(newest[1], 1, 14), 16)
        local ts = tonumber(newest[2])
        at = max(now, ts)
        -- The entry at or before the edge with the greatest time: the
        -- window holds what came after it.
        local edge = call('ZRANGE', k, now - W, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
        before = tonumber(sub(edge[1], 1, 14), 16)
        rank = call('ZRANK', k, edge[1])
        card = call('ZCARD', k)
        if total - before > 0 then
          R[b + HRESET] = ts + W - now
        end
      end
      local n = total - before
      R[b + HREM] = L - n
      if c > M then
        -- denied: cost too high
      elseif n + c > L then
        -- The oldest entries must leave until the request fits: find the
        -- first whose total frees enough, by binary search on rank.
        local want = before + n + c - L
        local lo, hi = rank + 1, card - 1
        while lo < hi do
          local mid = floor((lo + hi) / 2)
          if tonumber(sub(call('ZRANGE', k, mid, mid)[1], 1, 14), 16) >= want then
            hi = mid
          else
            lo = mid + 1
          end
        end
        R[b + HRETRY] = tonumber(call('ZRANGE', k, lo, lo, 'WITHSCORES')[2]) + W - now
      else
        R[b + OK], R[b + TREM], R[b + TRESET] = 1, L - n - c, at + W - now
        R[b + LAT], R[b + LRANK], R[b + WTTL], R[b + TOKEN] = at, rank, max(ceil((at + W - now) / 1000), 1) + slack, at
        R[b + LTOTAL] = total + c
      end
    else -- token_bucket (4); leaky_bucket (5) and gcra (6), which is one with it
      if not up then
        -- up(x) is math.ceil(x), and x - x % 1 math.floor(x), exactly: a
        -- call into C costs Redis several times what the arithmetic does,
        -- so the hot paths call neither.
        up = function(x)
          local f = x - x % 1
          if f < x then
            return f + 1
          end
          return f
        end
        -- level_at is a bucket's level at a time: a token bucket's tokens
        -- (a == 4), refilling up to B, or a leaky bucket's (and gcra's)
        -- level, draining to 0, from the state (t, x) read, if any.
        level_at = function(a, t, x, B, L, W, at)
          if a == 4 then
            if not t then
              return B
            end
            local dt = at - t
            if dt < 0 then
              dt = 0
            end
            local v = x + dt * L / W
            if v > B then
              return B
            end
            return v
          end
          if not t then
            return 0
          end
          local dt = at - t
          if dt < 0 then
            dt = 0
          end
          local v = x - dt * L / W
          if v < 0 then
            return 0
          end
          return v
        end
      end
      local t, x
      local v = pcall('GET', k)
      if type(v) == 'string' and #v == 16 then
        t, x = sunpack('<dd', v)
      else
        hexes(v) -- raises if the key cannot be read
      end
      local level = level_at(a, t, x, B, L, W, now)
      if a == 4 then
        R[b + HREM] = level - level % 1
        R[b + HRESET] = up((B - level) * W / L)
      else
        local left = B - level
        left = left - left % 1
        if left < 0 then
          left = 0
        end
        R[b + HREM] = left
        R[b + HRESET] = up(level * W / L)
      end
      if c > M then
        -- denied: cost too high
      elseif a == 4 then
        if level < c then
          local wait = ceil((c - level) * W / L)
          for _ = 1, RETRY_STEPS do
            if level_at(a, t, x, B, L, W, now + wait) >= c then
              break
            end
            wait = wait + 1
          end
          R[b + HRETRY] = wait
        else
          level = level - c
          R[b + OK], R[b + TREM], R[b + TRESET] = 1, level - level % 1, up((B - level) * W / L)
        end
      else
        -- The request waits until enough has drained for it to fit.
        local over, wait = level + c - B, 0
        if over > 0 then
          wait = ceil(over * W / L)
        end
        if wait > D then
          local retry = wait - D
          for _ = 1, RETRY_STEPS do
            local o = level_at(a, t, x, B, L, W, now + retry) + c - B
            if o <= 0 or ceil(o * W / L) <= D then
              break
            end
            retry = retry + 1
          end
          R[b + HRETRY] = retry
        else
          level = level + c
          local left = B - level
          left = left - left % 1
          if left < 0 then
            left = 0
          end
          R[b + OK], R[b + TREM], R[b + TRESET], R[b + TDELAY] = 1, left, up(level * W / L), wait
        end
      end
      if R[b + OK] == 1 then
        -- The key lives as long as its state can matter: a full refill
        -- (token_bucket) or drain (leaky_bucket, gcra, whose level may
        -- exceed B by the delay), in ms. Written with its whole horizon
        -- rather than the time its state matters now, a busy client's key
        -- is overwritten, not expired and created again at every request:
        -- the difference is Redis's active expiry, which otherwise deletes
        -- a key for every request.
        local H = B * W / L
        if a ~= 4 then
          H = H + D
        end
        H = H / 1000
        if H % 1 > 0 then
          H = H - H % 1 + 1
        end
        if H < 1 then
          H = 1
        end
        R[b + WVAL], R[b + WTTL] = spack('<dd', now, level), H + slack
      end
    end
    if R[b + OK] == 0 and sh ~= 1 then
      all = 0
    end
  end
  -- Phase two: only if the request is admitted, write, and answer with the
  -- counts after consuming; otherwise answer with the counts as they stand.
  for i = 1, nrules do
    local b = 17 * (i - 1)
    local ok, reason, rem, reset, retry, delay = R[b + OK], 0, R[b + HREM], R[b + HRESET], R[b + HRETRY], 0
    if R[b + COST] > R[b + MAXCOST] then
      reason, retry = 2, 0
    elseif ok == 0 then
      reason = 1
    elseif all == 1 then
      local k = R[b + KEY]
      if R[b + ALG] ~= 2 then
        if R[b + WTTL] == 0 then
          call('SET', k, R[b + WVAL], 'KEEPTTL')
        else
          call('SET', k, R[b + WVAL], 'PX', R[b + WTTL])
        end
      else
        -- Record the admission in the log.
        local total, rank = R[b + LTOTAL], R[b + LRANK]
        if R[b + WVAL] == 'replace' then
          call('DEL', k)
        end
        if R[b + WVAL] ~= 'append' then
          call('ZADD', k, '-inf', '00000000000000')
        elseif total >= REBASE then
          -- Restart the totals from the kept edge entry: rewrite the
          -- window.
          local kept = call('ZRANGE', k, rank, -1, 'WITHSCORES')
          local base = tonumber(sub(kept[1], 1, 14), 16)
          call('DEL', k)
          call('ZADD', k, '-inf', '00000000000000')
          for j = 3, #kept, 2 do
            call('ZADD', k, kept[j + 1], format('%014x', tonumber(sub(kept[j], 1, 14), 16) - base) .. sub(kept[j], 15))
          end
          total, rank = total - base, 0
        end
        call('ZADD', k, R[b + LAT], format('%014x:%x', total, rid))
        call('PEXPIRE', k, R[b + WTTL])
        if rank > 0 then
          call('ZREMRANGEBYRANK', k, 0, min(rank, SWEEP) - 1)
        end
      end
      rem, reset, delay = R[b + TREM], R[b + TRESET], R[b + TDELAY]
    end
    r = r + 1
    if i == 1 then
      reply[r] = spack(FIRST, all, ok, reason, rem, reset, retry, delay, R[b + TOKEN])
    else
      reply[r] = spack(NEXT, ok, reason, rem, reset, retry, delay, R[b + TOKEN])
    end
  end
end
if r == 1 then
  return reply[1]
end
return concat(reply, '', 1, r)
