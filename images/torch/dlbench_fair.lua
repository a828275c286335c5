-- The fair profile in Lua Torch7: `th dlbench_fair.lua CONFIG.json`.  The adapter (fair.py)
-- writes the arrays as raw files (uint8 images N x C x H x W, int32 labels 0-9 and the
-- steps' image indices from 0, float32 weights in the neutral layout) and the network as
-- plain data; the images become the network's float32 input here as dlbench_runner/fair.py
-- makes it (MNIST times 1/256, CIFAR-10 less each channel's mean: one rounding each, as
-- numpy's); this program builds it in nn, then answers one request a line on stdin,
-- each with one event `:::DLBENCH-TH {json}` on stdout:
--   probe   -> `probed`: the logits of the probe images written to config.probe_out
--   train   -> `step` {step, loss, correct} for every step, then `trained`
--   test    -> `tested` {loss, correct}: the whole test set, in batches of 1000
--   op P    -> `timed` {forward, forward_backward}: one layer's passes timed (P: its JSON,
--              time_op's comment)
--   save P  -> `saved`: the model (torch.save, its buffers cleared) at P
--   finish  -> `finish` {param_count, threads, blas, jit}; then th exits
-- Layouts: nn.SpatialConvolutionMM holds (out, in * kH * kW), the neutral (out, in, kH, kW)
-- flattened; nn.View(-1) flattens C, H, W; nn.Linear holds (out, in).  The poolings are
-- :ceil() (Caffe's output size), the average one counting only the inputs a window covers
-- (:setCountExcludePad()).  The loss is nn.CrossEntropyCriterion (the batch's mean); the
-- step is written out as the neutral rule on getParameters()'s flat views.
require 'torch'
require 'nn'
local cjson = require 'cjson'
package.path = paths.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local blas_files = require 'dlbench_blas'

local config = cjson.decode(io.open(arg[1]):read('*a'))
torch.setdefaulttensortype('torch.FloatTensor')
if config.threads then torch.setnumthreads(config.threads) end

local function emit(event, fields)
   fields = fields or {}
   fields.event = event
   io.stdout:write('\n:::DLBENCH-TH ' .. cjson.encode(fields) .. '\n')
   io.stdout:flush()
end

local function raw(entry, kind)
   local n = 1
   for _, d in ipairs(entry.shape) do n = n * d end
   local file = torch.DiskFile(entry.path, 'r'):binary()
   local storage = file['read' .. kind](file, n)
   file:close()
   assert(storage:size() == n, entry.path .. ': short file')
   return torch[kind .. 'Tensor'](storage, 1, torch.LongStorage(entry.shape))
end

local function write_floats(path, tensor)
   local file = torch.DiskFile(path, 'w'):binary()
   file:writeFloat(tensor:contiguous():storage())
   file:close()
end

-- the network ------------------------------------------------------------------------
-- `layers` in an nn.Sequential, their weights from `weights` (one layer's entry of
-- config.weights); `flat`: their input is already N x features
local function build(layers, weights, flat)
   local model = nn.Sequential()
   for _, layer in ipairs(layers) do
      local module
      if layer.kind == 'conv' then
         module = nn.SpatialConvolutionMM(layer['in'], layer.out, layer.kernel, layer.kernel, 1, 1,
                                          layer.pad, layer.pad)
      elseif layer.kind == 'pool' then
         if layer.mode == 'max' then
            module = nn.SpatialMaxPooling(layer.kernel, layer.kernel, layer.stride, layer.stride):ceil()
         else
            module = nn.SpatialAveragePooling(layer.kernel, layer.kernel, layer.stride, layer.stride)
               :ceil():setCountExcludePad()
         end
      elseif layer.kind == 'relu' then
         module = nn.ReLU()
      else
         if not flat then model:add(nn.View(-1):setNumInputDims(3)); flat = true end
         module = nn.Linear(layer['in'], layer.out)
      end
      if weights[layer.name] then
         local w = weights[layer.name]
         module.weight:copy(raw(w.weight, 'Float'):viewAs(module.weight))
         module.bias:copy(raw(w.bias, 'Float'))
      end
      model:add(module)
   end
   return model
end

local model = build(config.network.layers, config.weights, false)
local criterion = nn.CrossEntropyCriterion()
local parameters, gradients = model:getParameters()
local velocity = gradients:clone():zero()

local function inputs(entry)
   local x = raw(entry, 'Byte'):float()
   if config.scale then x:mul(config.scale) end
   for c, mean in ipairs(config.means or {}) do x:select(2, c):add(-mean) end
   return x
end

local train_x, test_x = inputs(config.train_x), inputs(config.test_x)
local train_y = raw(config.train_y, 'Int'):long():add(1)
local test_y = raw(config.test_y, 'Int'):long():add(1)
local order = raw(config.order, 'Int'):long():add(1)

local function correct(output, labels)
   local _, predicted = output:max(2)
   return predicted:view(-1):eq(labels):sum()
end

local function train()
   model:training()
   local lr, momentum = config.learning_rate, config.momentum
   for step = 1, order:size(1) do
      local index = order[step]
      local x, y = train_x:index(1, index), train_y:index(1, index)
      gradients:zero()
      local output = model:forward(x)
      local loss = criterion:forward(output, y)
      model:backward(x, criterion:backward(output, y))
      velocity:mul(momentum):add(gradients)
      parameters:add(-lr, velocity)
      emit('step', {step = step - 1, loss = loss, correct = correct(output, y)})
   end
   emit('trained')
end

local function test()
   model:evaluate()
   local loss_sum, right, n = 0, 0, test_x:size(1)
   for start = 1, n, 1000 do
      local count = math.min(1000, n - start + 1)
      local x, y = test_x:narrow(1, start, count), test_y:narrow(1, start, count)
      local output = model:forward(x)
      loss_sum = loss_sum + criterion:forward(output, y) * count
      right = right + correct(output, y)
   end
   emit('tested', {loss = loss_sum / n, correct = right})
end

-- one layer (or the network) timed alone, as ops.py says: `op` holds its layers, whether its
-- input is flat, the raw input and output gradient, the repeats and the warm-up rounds;
-- the forward pass in training mode, then the forward and backward pass (nn's backward:
-- the parameters' gradients and the input's, as the training's model:backward computes)
local function time_op(op)
   local module = build(op.layers, config.weights, op.flat)
   module:training()
   local x, g = raw(op.x, 'Float'), raw(op.g, 'Float')
   local times = {forward = {}, forward_backward = {}}
   local timer = torch.Timer()
   for round = 1, op.warmup + op.repeats do
      timer:reset()
      module:forward(x)
      local forward = timer:time().real
      timer:reset()
      module:forward(x)
      module:backward(x, g)
      local forward_backward = timer:time().real
      if round > op.warmup then
         table.insert(times.forward, forward)
         table.insert(times.forward_backward, forward_backward)
      end
   end
   return times
end

for line in io.stdin:lines() do
   local request, argument = line:match('^(%S+)%s*(.*)$')
   if request == 'probe' then
      model:evaluate()
      write_floats(config.probe_out, model:forward(test_x:narrow(1, 1, config.probe_images)))
      emit('probed')
   elseif request == 'train' then
      train()
   elseif request == 'test' then
      test()
   elseif request == 'op' then
      emit('timed', time_op(cjson.decode(io.open(argument):read('*a'))))
   elseif request == 'save' then
      model:clearState()
      torch.save(argument, model)
      emit('saved', {path = argument})
   elseif request == 'finish' then
      emit('finish', {param_count = parameters:nElement(), threads = torch.getnumthreads(),
                      blas = blas_files(), jit = jit.version})
      break
   else
      error('dlbench fair: unknown request ' .. tostring(line))
   end
end
