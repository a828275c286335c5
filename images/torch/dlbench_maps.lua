-- A connection-table convolution (nn.SpatialConvolutionMap) computed as a full
-- nn.SpatialConvolution whose kernels outside the table are held at zero: the same
-- function and the same trainable parameters, with more arithmetic (every input plane
-- is convolved into every output plane).  cunn has no CUDA version of the Map, but one of
-- the full convolution, so this is how the harness runs GTDLBench's CIFAR-10 script on a
-- GPU.  See docs/frameworks/torch.md ("On a GPU") for what it changes and what not.
--
--   local maps = require 'dlbench_maps'
--   local conv = maps.masked(map)     -- map: an nn.SpatialConvolutionMap, weights and all
--
-- The masked module's output is the Map's for the same weights; its gradient of the
-- kernels outside the table is zeroed after every accumulation, so no update of optim's
-- (SGD with or without momentum or weight decay: each keeps a zero at zero) moves them.
require 'nn'

local Masked, parent = torch.class('nn.DlbenchMaskedConvolution', 'nn.SpatialConvolution')

function Masked:accGradParameters(input, gradOutput, scale)
   parent.accGradParameters(self, input, gradOutput, scale)
   self.gradWeight:cmul(self.mask)
end

function Masked:__tostring__()
   return string.format('nn.DlbenchMaskedConvolution(%d -> %d, %dx%d, %d of %d kernels: a '
                        .. 'SpatialConvolutionMap)', self.nInputPlane, self.nOutputPlane,
                        self.kW, self.kH, self.connections, self.nInputPlane * self.nOutputPlane)
end

local maps = {}

-- The full convolution computing what `map` computes, with its weights and bias.  The
-- random numbers the full convolution's own reset() draws are given back, so the script
-- goes on with the random stream it would have had (its later layers' weights, its order).
function maps.masked(map)
   local state = torch.getRNGState()
   local conv = nn.DlbenchMaskedConvolution(map.nInputPlane, map.nOutputPlane, map.kW, map.kH,
                                            map.dW, map.dH)
   torch.setRNGState(state)
   conv = conv:type(map.weight:type())
   conv.weight:zero()
   conv.mask = conv.weight:clone()
   local connections = map.connTable:size(1)
   for k = 1, connections do
      local input, output = map.connTable[k][1], map.connTable[k][2]
      conv.weight[output][input]:copy(map.weight[k])
      conv.mask[output][input]:fill(1)
   end
   conv.bias:copy(map.bias)
   conv.connections = connections
   return conv
end

-- The trainable parameters of a masked module: the table's kernels and the biases, as the
-- Map holds them.
function maps.trainable(conv)
   return conv.connections * conv.kW * conv.kH + conv.bias:nElement()
end

-- From now on nn.SpatialConvolutionMap(...) builds the Map as written and returns its
-- masked twin; the masked modules made are appended to `made`.
function maps.replace(made)
   local Map = nn.SpatialConvolutionMap
   nn.SpatialConvolutionMap = setmetatable({}, {
      __index = Map,
      __call = function(_, ...)
         local conv = maps.masked(Map(...))
         made[#made + 1] = conv
         return conv
      end})
end

return maps
