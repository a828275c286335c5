-- Runs one of GTDLBench's Torch scripts unchanged, as `th dlbench_harness.lua
-- CONFIG.json SCRIPT ARGS...`, with only what the dlbench runner needs around it:
--
-- * torch.load serves the data files the script asks for ('mnist.t7/*_32x32.t7',
--   'cifar-10-batches-t7/*.t7') as the tensors those files hold, read from raw
--   byte arrays the adapter wrote from the canonical MNIST/CIFAR-10 files;
-- * the globals the script assigns are watched: `train` and `test` are wrapped so
--   each call is announced on stdout and waits for the runner's go (so the runner's
--   own clock brackets them); `numEpoch`, `nbTrainingPatches`/`nbTestingPatches`
--   (MNIST) and `trsize`/`tesize` (CIFAR-10) take the job's epoch count and subsets;
--   `criterion` and `confusion` are observed for the epoch's loss and accuracy;
-- * at the end, the script's own `trainTime` / `testTime` (what it prints as
--   "whole training time" / "whole test time"), its last epoch's test time (what
--   it prints as "test time" after the last pass: `testTime` less its value when
--   that pass began) and getParameters()'s size;
-- * on a GPU (`gpu` in the config: the device's index from 0), what a Torch script
--   written for one does: cunn loaded, the model and criterion converted to the CUDA
--   twin of the script's default tensor type (torch.CudaTensor for float32,
--   torch.CudaDoubleTensor for float64) when the script first flattens the model's
--   parameters, modules added after that converted as they are added, and each batch
--   the script passes to the model copied to the GPU; the GPU is synchronised before
--   every event, so the runner's clock reads finished work;
-- * on a GPU too, each nn.SpatialConvolutionMap the script builds (CIFAR-10's; cunn has
--   none) is replaced by its masked full-convolution twin (dlbench_maps.lua): the same
--   function and trainable parameters, built from the Map the script made.
--
-- Events are lines `:::DLBENCH-TH {json}` at the start of a fresh line.
require 'torch'
local cjson = require 'cjson'

local config_path, script = arg[1], arg[2]
local config = cjson.decode(io.open(config_path):read('*a'))
local script_args = {[0] = script}
for i = 3, #arg do script_args[#script_args + 1] = arg[i] end

-- the GPU -----------------------------------------------------------------------------
local gpu = config.gpu ~= nil
local CUDA_TWIN = {['torch.FloatTensor'] = 'torch.CudaTensor',
                   ['torch.DoubleTensor'] = 'torch.CudaDoubleTensor'}
local cuda_type = nil
if gpu then
   require 'cunn'
   cutorch.setDevice(config.gpu + 1)
end

local function synchronize()
   if gpu then cutorch.synchronize() end
end

local masked = {}       -- the masked twins of the script's SpatialConvolutionMaps, on a GPU
if gpu then
   local here = paths.dirname(debug.getinfo(1, 'S').source:sub(2))
   package.path = here .. '/?.lua;' .. package.path
   require('dlbench_maps').replace(masked)
end

local function model_on_gpu(model)
   local getParameters = model.getParameters
   model.getParameters = function(self)
      if cuda_type == nil then
         local default = torch.getdefaulttensortype()
         cuda_type = CUDA_TWIN[default] or error('dlbench harness: no CUDA tensor type for ' .. default)
         self:type(cuda_type)
         -- the batch the script built on the CPU, copied once for a forward and the backward after it
         local forward, backward, add = self.forward, self.backward, self.add
         local host_input, device_input = nil, nil
         self.forward = function(m, input)
            host_input = input
            device_input = (device_input or torch.Tensor():type(cuda_type)):resize(input:size()):copy(input)
            return forward(m, device_input)
         end
         self.backward = function(m, input, ...)
            if input ~= host_input then return backward(m, input:type(cuda_type), ...) end
            host_input = nil
            return backward(m, device_input, ...)
         end
         self.add = function(m, module, ...) return add(m, module:type(cuda_type), ...) end
      end
      return getParameters(self)
   end
   return model
end

local function criterion_on_gpu(criterion)
   -- nn's criteria move a CPU target to the GPU themselves
   return cuda_type and criterion:type(cuda_type) or criterion
end

local function emit(event, fields)
   synchronize()
   fields = fields or {}
   fields.event = event
   io.stdout:write('\n:::DLBENCH-TH ' .. cjson.encode(fields) .. '\n')
   io.stdout:flush()
end

local function wait_for_go()
   local line = io.stdin:read('*l')
   if line ~= 'go' then error('dlbench harness: the runner went away (' .. tostring(line) .. ')') end
end

-- the data files, served from raw bytes -------------------------------------------
local function bytes(path, shape)
   local n = 1
   for _, d in ipairs(shape) do n = n * d end
   local file = torch.DiskFile(path, 'r'):binary()
   local storage = file:readByte(n)
   file:close()
   assert(storage:size() == n, path .. ': short file')
   return torch.ByteTensor(storage, 1, torch.LongStorage(shape))
end

local original_load = torch.load
torch.load = function(path, ...)
   -- the scripts name them relative to the working directory (paths.concat makes them absolute)
   local cwd = paths.cwd() .. '/'
   local relative = path:sub(1, #cwd) == cwd and path:sub(#cwd + 1) or path
   local served = config.files[relative]
   if served == nil then return original_load(path, ...) end
   local data = bytes(served.data, served.data_shape)
   if served.transpose then data = data:t():contiguous() end
   return {data = data, labels = bytes(served.labels, served.labels_shape)}
end

-- the script's globals -------------------------------------------------------------
local phase, epoch = nil, 0
local loss_sum, loss_count, last_valid = 0, 0, nil
-- the script's testTime (the sum of its per-epoch test passes) when its last test pass began
local test_time_before, test_passes = 0, 0

local function wrap(name, fn)
   return function(...)
      if name == 'train' then epoch = epoch + 1 end
      if name == 'test' then
         test_time_before, test_passes = rawget(_G, 'testTime') or 0, test_passes + 1
      end
      loss_sum, loss_count, last_valid = 0, 0, nil
      emit('begin', {phase = name, epoch = epoch})
      wait_for_go()
      phase = name
      local results = {fn(...)}
      phase = nil
      local loss = loss_count > 0 and loss_sum / loss_count or nil
      emit('end', {phase = name, epoch = epoch, accuracy = last_valid, loss = loss,
                   samples = (...):size()})
      wait_for_go()
      return unpack(results)
   end
end

local function observe_criterion(criterion)
   local forward = criterion.forward
   criterion.forward = function(self, ...)
      local f = forward(self, ...)
      if phase then loss_sum, loss_count = loss_sum + f, loss_count + 1 end
      return f
   end
   return criterion
end

local function observe_confusion(confusion)
   -- the scripts print the matrix (which updates totalValid) and then zero it
   local zero = confusion.zero
   confusion.zero = function(self, ...)
      if phase then last_valid = self.totalValid end
      return zero(self, ...)
   end
   return confusion
end

local watch = {
   train = function(v) return wrap('train', v) end,
   test = function(v) return wrap('test', v) end,
   criterion = function(v) return observe_criterion(gpu and criterion_on_gpu(v) or v) end,
   model = function(v) return gpu and model_on_gpu(v) or v end,
   confusion = observe_confusion,
   numEpoch = function(v) return config.epochs or v end,
   nbTrainingPatches = function(v) return config.train_subset or v end,
   trsize = function(v) return config.train_subset or v end,
   nbTestingPatches = function(v) return config.test_subset or v end,
   tesize = function(v) return config.test_subset or v end,
}
-- th has already given _G Penlight's metatable (its modules as lazy globals, which the
-- scripts meet too, e.g. `lapp`; and `config`, which train-on-cifar-10.lua's
-- `config = config or {...}` finds): it is kept, with a __newindex added.
local globals = getmetatable(_G) or {}
local previous_newindex = globals.__newindex
globals.__newindex = function(t, k, v)
   if watch[k] and v ~= nil then v = watch[k](v) end
   if previous_newindex then return previous_newindex(t, k, v) end
   rawset(t, k, v)
end
setmetatable(_G, globals)

-- run the script as `th SCRIPT ARGS` would ----------------------------------------
package.path = paths.dirname(script) .. '/?.lua;' .. package.path
arg = script_args
emit('start', {script = script, jit = jit.version})
dofile(script)

local blas = {}
local maps = io.open('/proc/self/maps')
if maps then
   for line in maps:lines() do
      local path = line:match('(/%S+)$')
      if path and (path:find('blas') or path:find('lapack')) and not blas[path] then
         blas[path] = true
      end
   end
   maps:close()
end
local blas_list = {}
for path in pairs(blas) do blas_list[#blas_list + 1] = path end
table.sort(blas_list)
local test_time = rawget(_G, 'testTime')
-- trainable parameters: a masked twin's zeros outside its table are not parameters
local param_count = rawget(_G, 'parameters') and parameters:nElement() or nil
for _, conv in ipairs(masked) do
   param_count = param_count - conv.weight:nElement() - conv.bias:nElement()
                 + require('dlbench_maps').trainable(conv)
end
emit('finish', {train_time = rawget(_G, 'trainTime'), test_time = test_time,
                last_test_time = test_time and test_time - test_time_before, test_passes = test_passes,
                param_count = param_count, masked_maps = #masked,
                threads = torch.getnumthreads(), tensor_type = cuda_type or torch.getdefaulttensortype(),
                gpu_name = gpu and cutorch.getDeviceProperties(config.gpu + 1).name or nil,
                -- under th, Penlight's `config` module is a lazy global: train-on-cifar-10.lua's
                -- `config = config or {learningRate = ...}` keeps it, so optim.sgd runs on its
                -- defaults (rate 1e-3, no decay) -- as it did for GTDLBench
                sgd_config_is_penlight = package.loaded['pl.config'] ~= nil
                                         and rawget(_G, 'config') == package.loaded['pl.config'],
                jit = jit.version, blas = blas_list})
