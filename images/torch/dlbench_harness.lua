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
--   `criterion` and `confusion` are observed for the epoch's loss and accuracy, and
--   the classes a test pass predicted, in the order it added them to `confusion`;
-- * at the end, the script's own `trainTime` / `testTime` (what it prints as
--   "whole training time" / "whole test time"), its last epoch's test time (what
--   it prints as "test time" after the last pass: `testTime` less its value when
--   that pass began) and getParameters()'s size and element size;
-- * then the runner's requests, one a line, each answered by one event; th exits at the
--   end of its input:
--     save PATH                           -> `saved`: the script's trained `model` saved with
--                                            torch.save (its buffers cleared first,
--                                            model:clearState(), as nn advises before saving)
--     predict N PIXELS                    -> `predicted` {predicted}
--     loss N PIXELS LABELS                -> `loss` {loss}
--     gradient N PIXELS LABELS GRADIENT   -> `gradient` {loss, predicted}, and GRADIENT written
--     losses N PIXELS LABELS LOSSES       -> `losses`, and LOSSES written: each image's loss,
--                                            raw float64 (the gradient check's 65 images at once)
--     logits N PIXELS OUT                 -> `logits`, and OUT written: the model's outputs
--     vjp N PIXELS OUTGRAD GRADIENT       -> `vjp` {predicted}, and GRADIENT written: the
--                                            outputs' vector-Jacobian product with OUTGRAD
--                                            (raw float64, N x outputs), by updateGradInput;
--                                            PIXELS `-`: the images of the `logits` request
--                                            just before, whose forward pass it reuses
--     layers DIR                          -> `layers`: the model's modules for the migration
--                                            check (see `layers` below)
--   the last five for the robustness check: PIXELS holds N images in [0, 1] as raw float64
--   (MNIST N x 28 x 28, CIFAR-10 N x 3 x 32 x 32), LABELS their classes as raw uint8 (0-9),
--   GRADIENT gets the loss's gradient with respect to the pixels, raw float64 of their shape
--   (paths without spaces, absolute or relative to the working directory); `predicted` is
--   the classes (0-9), `loss` ClassNLLCriterion summed over the N images.  The pixels go
--   through the script's preprocessing rebuilt from nn modules for the config's `dataset`
--   (MNIST: x 255, zero-padded to 32 x 32, normalizeGlobal's statistics of the test set,
--   observed on `testData`; CIFAR-10: x 255, image.rgb2yuv as a 1 x 1 convolution, a copy of
--   the script's `normalization` on Y, U and V with its `mean_u`/`std_u`, `mean_v`/`std_v`),
--   on the CPU in the script's tensor type, then the trained model in evaluate mode (on a
--   GPU, the batch copied there); the gradient is their updateGradInput, and the model's
--   parameters are left as trained.  Where the script left no model or statistics to rebuild
--   that from, the answer is `unavailable` {reason};
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

-- this harness's own modules (dlbench_maps, dlbench_blas) beside it
package.path = paths.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local masked = {}       -- the masked twins of the script's SpatialConvolutionMaps, on a GPU
if gpu then
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
-- A raw array the adapter wrote (numpy's tofile): kind 'Byte' (uint8) or 'Double' (float64).
local function raw(path, shape, kind)
   local n = 1
   for _, d in ipairs(shape) do n = n * d end
   local file = torch.DiskFile(path, 'r'):binary()
   local storage = file['read' .. kind](file, n)
   file:close()
   assert(storage:size() == n, path .. ': short file')
   return torch[kind .. 'Tensor'](storage, 1, torch.LongStorage(shape))
end

local function bytes(path, shape) return raw(path, shape, 'Byte') end

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
local predicted = nil       -- the test pass's classes (0-9), as confusion:add saw them
-- the script's testTime (the sum of its per-epoch test passes) when its last test pass began
local test_time_before, test_passes = 0, 0

local function wrap(name, fn)
   return function(...)
      if name == 'train' then epoch = epoch + 1 end
      if name == 'test' then
         test_time_before, test_passes = rawget(_G, 'testTime') or 0, test_passes + 1
      end
      loss_sum, loss_count, last_valid = 0, 0, nil
      predicted = name == 'test' and {} or nil
      emit('begin', {phase = name, epoch = epoch})
      wait_for_go()
      phase = name
      local results = {fn(...)}
      phase = nil
      local loss = loss_count > 0 and loss_sum / loss_count or nil
      emit('end', {phase = name, epoch = epoch, accuracy = last_valid, loss = loss,
                   samples = (...):size(), predictions = predicted})
      predicted = nil
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
   -- a test pass adds one image at a time, its outputs (or its class, 1-10): the class
   -- is the largest output's, as ConfusionMatrix takes it
   local add = confusion.add
   confusion.add = function(self, prediction, target)
      if predicted then
         local class = prediction
         if type(prediction) ~= 'number' then
            local _, index = prediction:max(1)
            class = index[1]
         end
         predicted[#predicted + 1] = class - 1
      end
      return add(self, prediction, target)
   end
   return confusion
end

-- MNIST's dataset:normalizeGlobal(mean, std) results, by set ('train', 'test'): the script
-- passes its globals mean and std, which nothing sets, so each set is normalised by its own
-- statistics, and it keeps neither pair (the robustness check needs the test set's)
local statistics = {}

local function observe_statistics(set)
   return function(dataset)
      local normalizeGlobal = type(dataset) == 'table' and rawget(dataset, 'normalizeGlobal')
      if normalizeGlobal then
         dataset.normalizeGlobal = function(...)
            local mean, std = normalizeGlobal(...)
            statistics[set] = {mean = mean, std = std}
            return mean, std
         end
      end
      return dataset
   end
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
   trainData = observe_statistics('train'),
   testData = observe_statistics('test'),
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

local blas_list = require('dlbench_blas')()
local test_time = rawget(_G, 'testTime')
-- trainable parameters: a masked twin's zeros outside its table are not parameters
local param_count = rawget(_G, 'parameters') and parameters:nElement() or nil
local param_element_size = rawget(_G, 'parameters') and parameters:elementSize() or nil
for _, conv in ipairs(masked) do
   param_count = param_count - conv.weight:nElement() - conv.bias:nElement()
                 + require('dlbench_maps').trainable(conv)
end
-- the statistics the script normalised its data with, for the record: MNIST's of each set
-- (normalizeGlobal's), CIFAR-10's of its training set's U and V
local function normalisation()
   if next(statistics) then return statistics end
   local mean_u, std_u = rawget(_G, 'mean_u'), rawget(_G, 'std_u')
   local mean_v, std_v = rawget(_G, 'mean_v'), rawget(_G, 'std_v')
   if mean_u then return {u = {mean = mean_u, std = std_u}, v = {mean = mean_v, std = std_v}} end
end
emit('finish', {train_time = rawget(_G, 'trainTime'), test_time = test_time,
                last_test_time = test_time and test_time - test_time_before, test_passes = test_passes,
                param_count = param_count, param_element_size = param_element_size,
                masked_maps = #masked, normalisation = normalisation(),
                threads = torch.getnumthreads(), tensor_type = cuda_type or torch.getdefaulttensortype(),
                gpu_name = gpu and cutorch.getDeviceProperties(config.gpu + 1).name or nil,
                -- under th, Penlight's `config` module is a lazy global: train-on-cifar-10.lua's
                -- `config = config or {learningRate = ...}` keeps it, so optim.sgd runs on its
                -- defaults (rate 1e-3, no decay) -- as it did for GTDLBench
                sgd_config_is_penlight = package.loaded['pl.config'] ~= nil
                                         and rawget(_G, 'config') == package.loaded['pl.config'],
                jit = jit.version, blas = blas_list})

-- the runner's requests: saves, then the robustness check -------------------------------
-- A save of the script's trained model.
local function save(path)
   local model = rawget(_G, 'model') or error('dlbench harness: the script made no global model')
   model:clearState()
   torch.save(path, model)
   emit('saved', {path = path})
end

-- The robustness check sees the model through the script's own preprocessing, rebuilt from
-- nn modules so that their updateGradInput carries the gradient back to the pixels (the
-- attack's [0, 1] scale; x 255 gives the bytes the script read).  Each builder returns the
-- preprocessing of a batch (N x image shape, the script's default tensor type), or nil and
-- why it cannot.
local RGB_TO_YUV = {{0.299, 0.587, 0.114},              -- image.rgb2yuv's rows Y, U, V
                    {-0.14713, -0.28886, 0.436},
                    {0.615, -0.51499, -0.10001}}

-- train-on-mnist.lua: the 28 x 28 digit zero-padded to mnist.t7's 32 x 32, then
-- normalizeGlobal's data:add(-mean), data:mul(1/std) with the test set's own statistics, as
-- the script's test() sees its images
local function mnist_preprocessing()
   local test = statistics.test
   if not test then return nil, 'the script normalised no test set with normalizeGlobal' end
   return nn.Sequential()
      :add(nn.MulConstant(255))
      :add(nn.SpatialZeroPadding(2, 2, 2, 2))
      :add(nn.AddConstant(-test.mean))
      :add(nn.MulConstant(1 / test.std))
end

-- train-on-cifar-10.lua: image.rgb2yuv as a 1 x 1 convolution; Y through a copy of the
-- script's own `normalization` (nn.SpatialContrastiveNormalization(1, image.gaussian1D(7)):
-- its kernel and threshold; copied for each request, since its divisive part keeps the border
-- coefficients of the first batch size it meets); U and V through add(-mean), div(-std) with
-- the training set's statistics the script kept in its globals (the division as a product
-- with -1 / std: equal to float64's rounding)
local function cifar_preprocessing()
   local found = {}
   for _, name in ipairs({'normalization', 'mean_u', 'std_u', 'mean_v', 'std_v'}) do
      found[name] = rawget(_G, name)
      if found[name] == nil then return nil, 'the script made no global ' .. name end
   end
   local yuv = nn.SpatialConvolution(3, 3, 1, 1)
   for out = 1, 3 do
      for input = 1, 3 do yuv.weight[out][input]:fill(RGB_TO_YUV[out][input]) end
   end
   yuv.bias:zero()
   local function standardised(plane, mean, std)
      return nn.Sequential():add(nn.Narrow(2, plane, 1))
                            :add(nn.AddConstant(-mean)):add(nn.MulConstant(-1 / std))
   end
   return nn.Sequential()
      :add(nn.MulConstant(255))
      :add(yuv)
      :add(nn.ConcatTable()
              :add(nn.Sequential():add(nn.Narrow(2, 1, 1)):add(found.normalization:clone()))
              :add(standardised(2, found.mean_u, found.std_u))
              :add(standardised(3, found.mean_v, found.std_v)))
      :add(nn.JoinTable(2))
end

local DATASETS = {mnist = {shape = {1, 28, 28}, preprocessing = mnist_preprocessing},
                  cifar10 = {shape = {3, 32, 32}, preprocessing = cifar_preprocessing}}

local function write_doubles(path, tensor)
   local copy = torch.DoubleTensor(tensor:size()):copy(tensor)
   local file = torch.DiskFile(path, 'w'):binary()
   file:writeDouble(copy:storage())
   file:close()
end

-- `predict N PIXELS`, `loss N PIXELS LABELS`, `gradient N PIXELS LABELS GRADIENT` or
-- `losses N PIXELS LABELS LOSSES`: N images
-- (float64, N x image shape) and their classes (uint8, 0-9) from the adapter's files; the
-- preprocessing, the trained model in evaluate mode and a ClassNLLCriterion summed over the
-- batch (the script's criterion averages).  The model's own updateOutput and updateGradInput,
-- not forward and backward: its input is made its type here (the harness's GPU copy of the
-- script's batches is not needed), and no gradient of its parameters is accumulated.
-- The last `logits` request's forward pass (its preprocessing, pixels, input and output:
-- the modules' state that updateGradInput reads), kept for a `vjp` of the same images that
-- follows it: the attacks ask for the logits, compute the output gradient from them and
-- ask for its vector-Jacobian product, which then costs no second forward pass.
local last_forward = nil

local function robust(request, n, pixels_path, labels_path, out_path)
   local known, model = DATASETS[config.dataset], rawget(_G, 'model')
   local kept = last_forward
   last_forward = nil
   local preprocessing, reason = nil, 'no preprocessing is known for ' .. tostring(config.dataset)
   if pixels_path == '-' then       -- the images of the logits request just before
      assert(request == 'vjp' and kept and kept.n == n, 'vjp of the last logits: none of ' .. n .. ' images')
      preprocessing = kept.preprocessing
   elseif known then
      preprocessing, reason = known.preprocessing()
   end
   if preprocessing and not model then reason = 'the script made no global model' end
   if not (preprocessing and model) then return emit('unavailable', {reason = reason}) end
   local default = torch.getdefaulttensortype()
   local model_type = cuda_type or default
   local pixels, input, output
   if kept and pixels_path == '-' then
      pixels, input, output = kept.pixels, kept.input, kept.output
   else
      pixels = raw(pixels_path, {n, unpack(known.shape)}, 'Double'):type(default)
      input = preprocessing:forward(pixels):type(model_type)
      model:evaluate()
      output = model:updateOutput(input)
   end
   if request == 'logits' then       -- the model's LogSoftMax outputs, N x 10
      write_doubles(labels_path, output)
      last_forward = {n = n, preprocessing = preprocessing, pixels = pixels, input = input, output = output}
      return emit('logits')
   end
   local _, classes = output:double():max(2)
   local predicted = classes:select(2, 1):add(-1):totable()
   if request == 'predict' then return emit('predicted', {predicted = predicted}) end
   if request == 'vjp' then          -- the outputs' vector-Jacobian product of a given gradient
      local size = output:size():totable()
      local gradient = model:updateGradInput(input, raw(labels_path, size, 'Double'):type(model_type))
      write_doubles(out_path, preprocessing:updateGradInput(pixels, gradient:type(default)))
      return emit('vjp', {predicted = predicted})
   end
   local targets = bytes(labels_path, {n}):long():add(1)
   if request == 'losses' then       -- ClassNLLCriterion's terms, one per image
      write_doubles(out_path, output:double():gather(2, targets:view(n, 1)):mul(-1))
      return emit('losses')
   end
   local nll = nn.ClassNLLCriterion(nil, false):type(model_type)
   local loss = nll:forward(output, targets)
   if request == 'loss' then return emit('loss', {loss = loss}) end
   local gradient = model:updateGradInput(input, nll:updateGradInput(output, targets))
   write_doubles(out_path, preprocessing:updateGradInput(pixels, gradient:type(default)))
   emit('gradient', {loss = loss, predicted = predicted})
end

local ROBUST_REQUESTS = {predict = true, loss = true, gradient = true, losses = true, logits = true,
                         vjp = true}

-- `layers DIR`: the migration check's view of the trained model: DIR/layers.json lists the
-- model's modules in order (their type and sizes) and the preprocessing's constants (MNIST:
-- the test set's mean and std; CIFAR-10: the training set's mean_u, std_u, mean_v, std_v,
-- the harness's rows of image.rgb2yuv, and the script's `normalization`: its type,
-- nInputPlane, threshold and thresval), each weight, bias and connection table a raw float64
-- file beside it (`<index>.weight`, `<index>.bias`, `<index>.connTable`; the normalization's
-- kernel `normalization.kernel`).  Answered by `layers`, or `unavailable` {reason}.
local LAYER_FIELDS = {'nInputPlane', 'nOutputPlane', 'kW', 'kH', 'dW', 'dH', 'padW', 'padH',
                      'ceil_mode', 'size', 'numInputDims', 'threshold', 'thresval'}
local LAYER_ARRAYS = {'weight', 'bias', 'connTable'}

local function describe(module, dir, prefix, arrays)
   local entry = {type = torch.typename(module)}
   for _, field in ipairs(LAYER_FIELDS) do
      local value = module[field]
      if type(value) == 'number' or type(value) == 'boolean' then entry[field] = value end
      if torch.isTypeOf(value, 'torch.LongStorage') then entry[field] = value:totable() end
   end
   for _, name in ipairs(arrays) do
      if torch.isTensor(module[name]) then
         entry[name] = module[name]:size():totable()
         write_doubles(dir .. '/' .. prefix .. '.' .. name, module[name])
      end
   end
   return entry
end

local function layers(dir)
   local model = rawget(_G, 'model')
   if not model then return emit('unavailable', {reason = 'the script made no global model'}) end
   local described = {modules = {}}
   if config.dataset == 'mnist' then
      local test = statistics.test
      if not test then return emit('unavailable', {reason = 'the script made no test statistics'}) end
      described.mean, described.std = test.mean, test.std
   elseif config.dataset == 'cifar10' then
      for _, name in ipairs({'normalization', 'mean_u', 'std_u', 'mean_v', 'std_v'}) do
         if rawget(_G, name) == nil then
            return emit('unavailable', {reason = 'the script made no global ' .. name})
         end
         described[name] = rawget(_G, name)
      end
      described.normalization = describe(normalization, dir, 'normalization', {'kernel'})
      described.rgb_to_yuv = RGB_TO_YUV
   else
      return emit('unavailable', {reason = 'no preprocessing is known for ' .. tostring(config.dataset)})
   end
   for index, module in ipairs(model.modules) do
      described.modules[index] = describe(module, dir, index, LAYER_ARRAYS)
   end
   local file = io.open(dir .. '/layers.json', 'w')
   file:write(cjson.encode(described))
   file:close()
   emit('layers')
end
for line in io.stdin:lines() do
   local words = {}
   for word in line:gmatch('%S+') do words[#words + 1] = word end
   if words[1] == 'save' then
      save(line:match('^save (.+)$'))
   elseif words[1] == 'layers' then
      layers(line:match('^layers (.+)$'))
   elseif ROBUST_REQUESTS[words[1]] and tonumber(words[2]) then
      robust(words[1], tonumber(words[2]), words[3], words[4], words[5])
   else
      error('dlbench harness: unknown request (' .. line .. ')')
   end
end
