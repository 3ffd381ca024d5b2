-- The greatest fence the gate for Redis data has recorded for a resource.
-- KEYS[1] the record  Reply: the fence, or false if none is recorded (or it has expired)
return redis.call('GET', KEYS[1])
