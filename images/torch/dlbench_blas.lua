-- The BLAS and LAPACK libraries mapped into this th process, by path, sorted: what the runner
-- records as `blas` for a Lua Torch7 job (Python's side reads its own process's maps; here
-- th trains, so th reads them).
--
--   local blas_files = require 'dlbench_blas'
--   emit('finish', {blas = blas_files()})
return function()
   local found, list = {}, {}
   local maps = io.open('/proc/self/maps')
   if maps then
      for line in maps:lines() do
         local path = line:match('(/%S+)$')
         if path and (path:find('blas') or path:find('lapack')) and not found[path] then
            found[path] = true
            list[#list + 1] = path
         end
      end
      maps:close()
   end
   table.sort(list)
   return list
end
